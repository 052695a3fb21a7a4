"""Checkpoints to resume training: engine state (model, optimizer, schedule), the loop's state
(step, last published version, beta, RNG) and the reference copy after a reset.

Layout: `DIR/step-00000042/{engine/, state.json, reference.pt}`, `DIR/LATEST` naming the
newest complete one and `DIR/RUN` the id of the run (docs/runs.md). A checkpoint is written
under a `.partial-` name and renamed when complete, then LATEST is replaced, so a crash
mid-save leaves the previous one in charge.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tba.trainer.engine import TrainEngine
from tba.trainer.reference import ReferenceResets

LATEST = "LATEST"
RUN_FILE = "RUN"
STATE_FILE = "state.json"
REFERENCE_FILE = "reference.pt"
_PARTIAL = ".partial-"


@dataclass
class LoopState:
    """What the loop carries from step to step."""

    step: int = 0
    version: int = 0  # last weight version published (0: none yet)
    published_step: int = -1  # step whose weights that version holds
    beta: float = 0.0
    rng: dict[str, Any] = field(default_factory=dict)
    reward_decay: dict[str, float] = field(default_factory=dict)  # RewardDecay.state


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": _jsonable(random.getstate()),
    }
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state["numpy"] = [kind, np.asarray(keys).tolist(), pos, has_gauss, cached]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    if not state:
        return
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


class Checkpointer:
    def __init__(self, root: Path, keep_last: int, engine: TrainEngine) -> None:
        self.root = root
        self.keep_last = keep_last
        self.engine = engine

    def save(self, state: LoopState, reference: ReferenceResets) -> Path:
        """Every rank calls this (DeepSpeed writes its shards); rank 0 finishes the files."""
        final = self.root / f"step-{state.step:08d}"
        partial = self.root / f"{_PARTIAL}{final.name}"
        if self.engine.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        self.engine.barrier()
        self.engine.save(partial / "engine")
        if self.engine.rank == 0:
            state.rng = capture_rng()
            (partial / STATE_FILE).write_text(json.dumps(asdict(state)))
            ref_state = reference.state_dict()
            if ref_state is not None:
                torch.save(ref_state, partial / REFERENCE_FILE)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            _write_atomically(self.root / LATEST, final.name)
            self._prune()
        self.engine.barrier()
        return final

    def latest(self) -> Path | None:
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text().strip()
        return path if (path / STATE_FILE).is_file() else None

    def load(self, path: Path, reference: ReferenceResets) -> LoopState:
        """Restores the engine, the reference copy (if any) and RNG; returns the loop state."""
        self.engine.load(path / "engine")
        data = json.loads((path / STATE_FILE).read_text())
        state = LoopState(**data)
        ref_file = path / REFERENCE_FILE
        if ref_file.is_file():
            ref_state = torch.load(ref_file, map_location="cpu", weights_only=True)
            reference.restore(self.engine.model, ref_state)
        restore_rng(state.rng)
        return state

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step-*") if (p / STATE_FILE).is_file())
        for old in done[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def run_id_for(root: Path, resume: bool) -> str:
    """The run this trainer belongs to, kept in `root/RUN` from registration on (before any
    checkpoint, so a crash before the first one resumes the same run): the kept id when
    resuming, else a new one (which replaces it)."""
    path = root / RUN_FILE
    if resume and path.is_file():
        kept = path.read_text().strip()
        if kept:
            return kept
    run_id = uuid.uuid4().hex
    root.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, run_id)
    return run_id
