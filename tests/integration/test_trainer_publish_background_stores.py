"""The training loop publishing in the background through both real object stores (file:// and
SeaweedFS s3://): every step's snapshot handed over, at most one upload in flight, versions
dense and increasing whatever was skipped, the last one the final step's weights in bf16,
retention, LATEST naming the newest, the final checkpoint naming what was announced, and the
step's publish metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.domain import Trajectory, WeightVersion
from tba.objectstore import ObjectStore, ObjectStoreSettings, open_object_store
from tba.objectstore.weights import fetch_weights, list_versions, read_latest
from tba.trainer.model import load_policy
from tba.trainer.publish import StorePublisher
from tests.integration.test_trainer_loop import MODEL, SelfSampledSource, make_loop, sample_pool

STEPS = 6
PUBLISH_KEYS = {
    "time/publish_s",
    "time/publish_blocking_s",
    "time/publish_background_s",
    "trainer/publish_skipped",
    "trainer/publish_failed",
}


@pytest.fixture(scope="module")
def pool() -> dict[str, list[Trajectory]]:
    return sample_pool(prompts=4, per_prompt=6)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return open_object_store(ObjectStoreSettings(uri=f"file://{tmp_path / 'store'}"))
    return open_object_store(request.getfixturevalue("s3_store_settings"))


def test_the_loop_publishes_every_step_in_the_background(store, tmp_path, pool):
    loop = make_loop(tmp_path, SelfSampledSource(pool), [], steps=STEPS, publish_every_steps=1)
    tokenizer, _ = load_policy(MODEL, seed=0)
    announced: list[WeightVersion] = []
    publisher = StorePublisher(
        store,
        loop.engine,
        tokenizer,
        announced.append,
        keep_versions=2,
        export_dtype=torch.bfloat16,
        background=True,
    )
    loop.publisher = publisher
    state = loop.run()

    skipped = publisher.progress().skipped
    # The starting weights and every step's: each announced, or replaced while waiting.
    assert len(announced) + skipped == STEPS + 1
    assert [w.version for w in announced] == list(range(1, len(announced) + 1))
    steps = [w.step for w in announced]
    assert steps[0] == 0 and steps == sorted(set(steps)) and steps[-1] == STEPS
    assert (state.version, state.published_step) == (announced[-1].version, STEPS)
    assert read_latest(store) == announced[-1]
    assert list_versions(store) == [w.version for w in announced[-2:]]

    local = fetch_weights(store, announced[-1], tmp_path / "fetched")
    published = AutoModelForCausalLM.from_pretrained(local).state_dict()
    for name, tensor in loop.engine.model.state_dict().items():
        assert torch.equal(published[name], tensor.to(torch.bfloat16)), name

    checkpoint = json.loads((tmp_path / "ckpt" / "step-00000006" / "state.json").read_text())
    assert (checkpoint["version"], checkpoint["published_step"]) == (len(announced), STEPS)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(set(line) >= PUBLISH_KEYS for line in lines)
    assert all(line["time/publish_blocking_s"] == line["time/publish_s"] for line in lines)
    assert all(line["trainer/publish_failed"] == 0 for line in lines)
    assert lines[-1]["trainer/publish_skipped"] == skipped
    # Versions announced while the loop ran show in the steps' trainer/version.
    logged = [int(line["trainer/version"]) for line in lines]
    assert logged == sorted(logged) and logged[-1] <= announced[-1].version
