"""The training loop end to end in one process: a real in-process source of batches made from
a tiny model's own samples, a real file:// object store, real checkpoints."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.domain import (
    Batch,
    Prompt,
    PromptGroup,
    SampleSource,
    SampleSpec,
    TrainerReport,
    Trajectory,
    pack_tokens,
)
from tba.models.config import ModelSettings
from tba.models.logprobs import sequence_logprobs
from tba.objectstore.local import FileStore
from tba.objectstore.weights import fetch_weights, list_versions, read_latest
from tba.trainer.checkpoint import Checkpointer, LoopState
from tba.trainer.config import OptimSettings, TrainerSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.loop import DataTimeoutError, TrainerLoop
from tba.trainer.loss import TrajectoryBalance
from tba.trainer.metrics import JsonlSink
from tba.trainer.model import load_policy
from tba.trainer.optim import RewardDecay
from tba.trainer.publish import StorePublisher
from tba.trainer.reference import ReferenceResets

TEMPERATURE = 1.0
MODEL = ModelSettings(tiny_layers=2, tiny_width=64, tiny_heads=2, tiny_positions=64)
REQUIRED_KEYS = {
    "trainer/loss",
    "trainer/log_z",
    "trainer/beta",
    "trainer/grad_norm",
    "trainer/samples_per_s",
    "trainer/staleness_mean",
    "time/wait_data_s",
    "time/compute_s",
    "time/publish_s",
}


def sample_pool(prompts: int, per_prompt: int) -> dict[str, list[Trajectory]]:
    """The starting policy's own samples (version 0), scored by the share of digits."""
    tokenizer, model = load_policy(MODEL, seed=0)
    model.eval()
    torch.manual_seed(1)
    pool = {}
    for p in range(prompts):
        prompt = tokenizer(f"{p}+{p + 2}=").input_ids
        out = model.generate(
            torch.tensor([prompt] * per_prompt),
            attention_mask=torch.ones(per_prompt, len(prompt), dtype=torch.long),
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=TEMPERATURE,
            max_new_tokens=6,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        completions = [
            _cut_at_eos(row[len(prompt) :].tolist(), tokenizer.eos_token_id) for row in out
        ]
        with torch.no_grad():
            logp = sequence_logprobs(
                model, [prompt] * per_prompt, completions, TEMPERATURE, tokenizer.pad_token_id
            )
        pool[f"p{p}"] = [
            _trajectory(f"p{p}", prompt, c, tokenizer.decode(c), float(lp))
            for c, lp in zip(completions, logp, strict=True)
        ]
    return pool


def _cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _trajectory(prompt_id: str, prompt: list[int], completion: list[int], text: str, logp: float):
    return Trajectory(
        prompt_id=prompt_id,
        prompt_token_ids=pack_tokens(prompt),
        completion_token_ids=pack_tokens(completion),
        completion_text=text,
        reward=sum(ch.isdigit() for ch in text) / max(len(text), 1),
        ref_logprob=logp,
        behavior_logprob=logp,
        policy_version=0,
    )


class SelfSampledSource:
    """Draws groups from the pool by the spec's seed, like the buffer's reward-priority
    sampling with tau = inf; the first `empty_draws` draws find an empty buffer."""

    def __init__(self, pool: dict[str, list[Trajectory]], empty_draws: int = 0) -> None:
        self.pool = pool
        self.empty_draws = empty_draws
        self.draws = 0
        self.reports: list[TrainerReport | None] = []

    def sample(self, spec: SampleSpec) -> Batch:
        self.draws += 1
        self.reports.append(spec.report)
        if self.draws <= self.empty_draws:
            return Batch([], latest_version=0)
        rng = np.random.default_rng(spec.seed)
        ids = rng.choice(
            sorted(self.pool), size=min(spec.num_prompts, len(self.pool)), replace=False
        )
        groups = []
        for pid in ids:
            trajs = self.pool[str(pid)]
            picks = rng.choice(
                len(trajs), size=min(spec.samples_per_prompt, len(trajs)), replace=False
            )
            groups.append(
                PromptGroup(Prompt(str(pid), ""), [trajs[i] for i in picks], SampleSource.REWARD)
            )
        return Batch(groups, latest_version=0)


@pytest.fixture(scope="module")
def pool() -> dict[str, list[Trajectory]]:
    return sample_pool(prompts=4, per_prompt=6)


def make_loop(
    tmp_path: Path,
    source: Any,
    announced: list,
    optim: OptimSettings | None = None,
    **overrides: Any,
) -> TrainerLoop:
    settings = TrainerSettings(
        **{
            "steps": 5,
            "num_prompts": 3,
            "samples_per_prompt": 4,
            "micro_batch_size": 5,
            "beta_start": 0.5,
            "beta_end": 0.1,
            "beta_anneal_steps": 4,
            "publish_every_steps": 2,
            "keep_versions": 2,
            "data_poll_s": 0.01,
            **overrides,
        }
    )
    tokenizer, model = load_policy(MODEL, seed=0)
    optim = optim or OptimSettings(lr=1e-3, schedule="cosine", warmup_steps=1)
    reward_decay = RewardDecay(optim) if optim.decay_by == "reward" else None
    engine = LocalEngine(model, optim, settings.steps, reward_decay=reward_decay)
    store = FileStore(f"file://{tmp_path / 'store'}")
    reference = ReferenceResets(
        settings.reference_reset_steps, TEMPERATURE, tokenizer.pad_token_id, 5
    )
    return TrainerLoop(
        settings=settings,
        engine=engine,
        source=source,
        publisher=StorePublisher(
            store, engine, tokenizer, announced.append, settings.keep_versions
        ),
        metrics=JsonlSink(tmp_path / "metrics.jsonl"),
        objective=TrajectoryBalance(),
        reference=reference,
        pad_token_id=tokenizer.pad_token_id,
        temperature=TEMPERATURE,
        checkpointer=Checkpointer(tmp_path / "ckpt", 2, engine),
        checkpoint_every_steps=2,
        reward_decay=reward_decay,
    )


def params(loop: TrainerLoop) -> list[torch.Tensor]:
    return [p.detach().clone() for p in loop.engine.model.parameters()]


def test_loop_trains_publishes_every_k_steps_and_logs_metrics(tmp_path, pool):
    announced: list = []
    source = SelfSampledSource(pool)
    loop = make_loop(tmp_path, source, announced)
    before = params(loop)
    state = loop.run()
    assert state.step == 5
    # initial weights, every k = 2 steps, and the final step
    assert [(w.version, w.step) for w in announced] == [(1, 0), (2, 2), (3, 4), (4, 5)]
    store = loop.publisher.store  # type: ignore[attr-defined]
    assert list_versions(store) == [3, 4] and read_latest(store) == announced[-1]
    local = fetch_weights(store, announced[-1], tmp_path / "fetched")
    published = AutoModelForCausalLM.from_pretrained(local)
    for a, b in zip(published.parameters(), loop.engine.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(before, params(loop), strict=True))

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    assert all(set(line) >= REQUIRED_KEYS for line in lines)
    assert all(np.isfinite(line["trainer/loss"]) and line["trainer/loss"] > 0 for line in lines)
    assert [line["trainer/beta"] for line in lines] == pytest.approx([0.5, 0.4, 0.3, 0.2, 0.1])
    assert lines[-1]["trainer/version"] == 3.0  # step 5 logs before the final publish
    assert all(line["trainer/staleness_mean"] == 0.0 for line in lines)
    # Each Sample call after the first carries the previous step's metrics to the buffer.
    reports = source.reports
    assert reports[0] is None and all(r is not None for r in reports[1:])
    assert [(r.step, r.loss, r.kl, r.lr) for r in reports[1:] if r is not None] == [
        (n["step"], n["trainer/loss"], n["trainer/kl"], n["trainer/lr"]) for n in lines[:4]
    ]


def test_a_resumed_run_continues_exactly_and_never_reuses_a_version(tmp_path, pool):
    straight = make_loop(tmp_path / "a", SelfSampledSource(pool), [], steps=4)
    straight.run()

    announced: list = []
    crashed = make_loop(tmp_path / "b", SelfSampledSource(pool), announced, steps=4)
    crashed.publish()
    crashed.train_step()
    crashed.train_step()  # checkpoints (every 2 steps), then the process dies
    second = make_loop(tmp_path / "b", SelfSampledSource(pool), announced, steps=4)
    checkpointer = second.checkpointer
    assert checkpointer is not None
    latest = checkpointer.latest()
    assert latest is not None and latest.name == "step-00000002"
    second.state = checkpointer.load(latest, second.reference)
    assert second.state.step == 2 and second.state.version == 2
    second.run()
    for a, b in zip(params(straight), params(second), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    versions = [w.version for w in announced]
    assert versions == sorted(set(versions)) == [1, 2, 3]


def test_after_a_reference_reset_the_reference_is_the_policy_of_that_step(tmp_path, pool):
    loop = make_loop(tmp_path, SelfSampledSource(pool), [], steps=3, reference_reset_steps=2)
    kls = [loop.train_step()["trainer/kl"] for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-5)  # on-policy data, stored reference
    assert abs(kls[1]) > 1e-4  # the policy moved away from the reference
    assert kls[2] == pytest.approx(0.0, abs=1e-5)  # reset after step 2: reference = policy


def test_the_loop_waits_for_data_and_gives_up_after_the_timeout(tmp_path, pool):
    source = SelfSampledSource(pool, empty_draws=3)
    loop = make_loop(tmp_path, source, [], steps=1)
    values = loop.train_step()
    assert source.draws == 4 and values["time/wait_data_s"] >= 0.03
    never = make_loop(tmp_path / "never", SelfSampledSource({}, empty_draws=10**9), [])
    never.settings = never.settings.model_copy(update={"data_timeout_s": 0.05})
    with pytest.raises(DataTimeoutError):
        never.train_step()


class LongPolledEmptySource:
    """A buffer that never has data and holds each Sample for its `wait_s` (a long poll)."""

    def __init__(self) -> None:
        self.specs: list[SampleSpec] = []

    def sample(self, spec: SampleSpec) -> Batch:
        self.specs.append(spec)
        time.sleep(spec.wait_s)
        return Batch([], latest_version=0, waited_s=spec.wait_s)


def test_the_loop_long_polls_for_its_batch_and_does_not_sleep_between_polls(tmp_path):
    source = LongPolledEmptySource()
    loop = make_loop(
        tmp_path, source, [], steps=1, min_batch_prompts=2, sample_wait_s=0.2, data_poll_s=30.0
    )
    loop.settings = loop.settings.model_copy(update={"data_timeout_s": 0.5})
    began = time.monotonic()
    with pytest.raises(DataTimeoutError):
        loop.train_step()
    assert time.monotonic() - began < 5.0  # a 30 s poll sleep would show
    assert [s.min_groups for s in source.specs] == [2] * len(source.specs)
    waits = [s.wait_s for s in source.specs]
    assert waits[0] == 0.2 and len(waits) == 3 and 0 < waits[-1] < 0.2  # up to the timeout


def test_loop_state_survives_a_checkpoint(tmp_path, pool):
    loop = make_loop(tmp_path, SelfSampledSource(pool), [], steps=1)
    loop.state = LoopState(step=7, version=3, published_step=6, beta=0.25)
    assert loop.checkpointer is not None
    path = loop.checkpointer.save(loop.state, loop.reference)
    restored = loop.checkpointer.load(path, loop.reference)
    assert (restored.step, restored.version, restored.published_step, restored.beta) == (
        7,
        3,
        6,
        0.25,
    )


def test_a_schedule_decaying_by_reward_follows_the_batches_and_is_checkpointed(tmp_path, pool):
    # Every reward is >= 0, past `reward_decay_to`: the first batch ends the decay.
    optim = OptimSettings(
        lr=1e-3,
        schedule="cosine",
        decay_by="reward",
        reward_decay_from=-1.0,
        reward_decay_to=-0.5,
        min_lr_ratio=0.1,
    )
    loop = make_loop(tmp_path, SelfSampledSource(pool), [], optim=optim, steps=2)
    rates = [loop.train_step()["trainer/lr"] for _ in range(2)]
    assert rates == pytest.approx([1e-3, 1e-4])
    assert loop.state.reward_decay["progress"] == 1.0
    assert loop.checkpointer is not None
    path = loop.checkpointer.save(loop.state, loop.reference)
    assert loop.checkpointer.load(path, loop.reference).reward_decay["progress"] == 1.0
