"""Publishing the engine's weights to an object store and announcing them to the buffer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tba.domain import WeightVersion
from tba.objectstore import ObjectStore
from tba.objectstore.weights import publish_weights
from tba.trainer.engine import TrainEngine


class StorePublisher:
    """Every rank calls `publish` (ZeRO-3 gathers weights collectively); rank 0 writes the
    version and announces it, and every rank gets the announced `WeightVersion`."""

    def __init__(
        self,
        store: ObjectStore,
        engine: TrainEngine,
        tokenizer: Any,
        announce: Callable[[WeightVersion], None],
        keep_versions: int,
    ) -> None:
        self.store = store
        self.engine = engine
        self.tokenizer = tokenizer
        self.announce = announce
        self.keep_versions = keep_versions

    def publish(self, version: int, step: int) -> WeightVersion:
        state_dict = self.engine.publish_state_dict()
        weights = None
        if self.engine.rank == 0:
            weights = publish_weights(
                self.store,
                version,
                step,
                self.engine.model,
                self.tokenizer,
                keep_last=self.keep_versions,
                state_dict=state_dict,
            )
            self.announce(weights)
        announced = self.engine.broadcast(weights)
        assert announced is not None
        return announced
