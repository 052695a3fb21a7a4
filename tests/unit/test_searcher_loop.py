"""The searcher loop's own logic on a tiny real engine, reference and weight sync, with an
in-process buffer that records what is posted (and can fail) where the point is the loop:
de-duplication, the reward guard, chunking and retries, skipped prompts, min_version."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tba.domain import AddResult, FinishReason, Lease, Prompt, Trajectory, unpack_tokens
from tba.errors import UnavailableError
from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.objectstore.local import FileStore
from tba.objectstore.weights import publish_weights
from tba.searcher.config import EngineSettings, SearcherSettings
from tba.searcher.hf_engine import TransformersEngine
from tba.searcher.loop import SearcherLoop
from tba.searcher.metrics import SearcherMetrics
from tba.searcher.reference import ReferenceScorer
from tba.searcher.weights import WeightSync
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import make_prompt

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)
PROMPTS = [make_prompt("arithmetic", f"{a}+{a}=", str(2 * a)) for a in (11, 12, 13)]


@dataclass
class RecordingBuffer:
    """Leases `prompts` under `lease-1`; records each add attempt; the first `failures`
    attempts fail as an unavailable buffer does once the client's retries are spent."""

    prompts: list[Prompt]
    failures: int = 0
    attempts: list[str] = field(default_factory=list)
    adds: list[tuple[list[Trajectory], str, str]] = field(default_factory=list)

    def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float = 0.0) -> Lease:
        taken = self.prompts[:max_prompts]
        return Lease("lease-1" if taken else "", taken, 0.0)

    def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        searcher_id: str,
        lease_id: str = "",
        request_id: str | None = None,
    ) -> AddResult:
        assert request_id
        self.attempts.append(request_id)
        if self.failures:
            self.failures -= 1
            raise UnavailableError("buffer unavailable")
        self.adds.append((list(trajectories), lease_id, request_id))
        return AddResult(len(trajectories), 0, 0)

    def posted(self) -> list[Trajectory]:
        return [t for batch, _, _ in self.adds for t in batch]


def make_loop(
    tmp_path: Path,
    buffer: RecordingBuffer,
    eos_nats: float = 20.0,
    task: object = None,
    latest: object = None,
    **settings: object,
) -> SearcherLoop:
    """A loop over a tiny engine; `eos_nats` 20 makes every completion a lone EOS."""
    tokenizer, model = load_model(MODEL, 0)
    with torch.no_grad():
        eos = model.transformer.wte.weight[tokenizer.eos_token_id]
        model.transformer.ln_f.bias += eos * (eos_nats / eos.dot(eos))
    engine = TransformersEngine(model, tokenizer, EngineSettings(device="cpu"))
    _, base = load_model(MODEL, 0)
    options = {"prompts_per_round": 3, "samples_per_prompt": 4, "max_new_tokens": 4}
    s = SearcherSettings(**{**options, "idle_poll_s": 0.01, **settings})
    sync = WeightSync(
        latest or (lambda: None),  # type: ignore[arg-type]
        FileStore(f"file://{tmp_path / 'store'}"),
        engine,
        tmp_path / "weights",
    )
    return SearcherLoop(
        settings=s,
        searcher_id="searcher-test",
        buffer=buffer,
        engine=engine,
        tokenizer=tokenizer,
        task=task or ArithmeticTask(),  # type: ignore[arg-type]
        reference=ReferenceScorer(base, tokenizer.pad_token_id, s.temperature, 5),
        weights=sync,
        metrics=SearcherMetrics(),
    )


@pytest.mark.parametrize(("drop", "expected"), [(True, 3), (False, 12)])
def test_identical_completions_of_a_prompt_are_posted_once(tmp_path, drop, expected):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, drop_duplicates=drop)
    values = loop.round()
    eos = loop.engine.tokenizer.eos_token_id  # type: ignore[attr-defined]
    posted = buffer.posted()
    assert values is not None and values["searcher/duplicates"] == 12 - expected
    assert len(posted) == expected
    assert sorted({t.prompt_id for t in posted}) == sorted(p.id for p in PROMPTS)
    assert all(unpack_tokens(t.completion_token_ids).tolist() == [eos] for t in posted)
    assert all(t.finish_reason == FinishReason.STOP for t in posted)


class FlakyReward:
    """Raises for one prompt, returns NaN for another: the task contract says never."""

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        if prompt.id == PROMPTS[0].id:
            raise ValueError("broken verifier")
        return math.nan if prompt.id == PROMPTS[1].id else 0.5


def test_a_reward_that_raises_or_is_not_finite_drops_only_that_completion(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, task=FlakyReward())
    values = loop.round()
    assert values is not None and values["searcher/dropped"] == 2
    assert [(t.prompt_id, t.reward) for t in buffer.posted()] == [(PROMPTS[2].id, 0.5)]
    assert buffer.adds[0][1] == "lease-1"


def test_each_chunk_has_its_own_request_id_and_the_last_acknowledges_the_lease(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, drop_duplicates=False, add_batch_size=5)
    loop.round()
    assert [len(batch) for batch, _, _ in buffer.adds] == [5, 5, 2]
    assert [lease for _, lease, _ in buffer.adds] == ["", "", "lease-1"]
    assert len({request for _, _, request in buffer.adds}) == 3


def test_an_unavailable_buffer_is_retried_with_the_same_request_id(tmp_path):
    buffer = RecordingBuffer(PROMPTS, failures=2)
    make_loop(tmp_path, buffer, add_retries=2).round()
    assert len(buffer.attempts) == 3 and len(set(buffer.attempts)) == 1
    assert buffer.adds[0][2] == buffer.attempts[0]

    down = RecordingBuffer(PROMPTS, failures=10)
    with pytest.raises(UnavailableError):
        make_loop(tmp_path, down, add_retries=2).round()
    assert len(down.attempts) == 3 and len(set(down.attempts)) == 1


class NoSpecialTokens:
    """A tokenizer without BOS, so empty text has no tokens at all."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


def test_prompts_without_tokens_or_too_long_are_skipped(tmp_path):
    empty = Prompt("empty", "", "0")
    long = make_prompt("arithmetic", "1+1=" * 10, "2")
    buffer = RecordingBuffer([empty, PROMPTS[0], long])
    loop = make_loop(tmp_path, buffer, max_prompt_tokens=20)
    loop.tokenizer = NoSpecialTokens(loop.tokenizer)
    values = loop.round()
    assert values is not None and values["searcher/prompts"] == 1
    assert {t.prompt_id for t in buffer.posted()} == {PROMPTS[0].id}

    nothing_usable = RecordingBuffer([empty])
    loop = make_loop(tmp_path, nothing_usable)
    loop.tokenizer = NoSpecialTokens(loop.tokenizer)
    assert loop.round() is None and loop.rounds == 0 and not nothing_usable.attempts


def test_no_free_prompt_is_an_idle_round_that_does_not_count(tmp_path):
    buffer = RecordingBuffer([])
    loop = make_loop(tmp_path, buffer)
    assert loop.round() is None
    assert loop.rounds == 0 and not buffer.attempts


def test_rounds_stop_at_max_rounds_and_carry_every_field(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, max_rounds=2, eos_nats=0.0)
    assert loop.run() == 2
    assert len(buffer.adds) == 2
    tokenizer = loop.engine.tokenizer  # type: ignore[attr-defined]
    for t in buffer.posted():
        prompt = next(p for p in PROMPTS if p.id == t.prompt_id)
        assert unpack_tokens(t.prompt_token_ids).tolist() == tokenizer.encode(prompt.text)
        completion = unpack_tokens(t.completion_token_ids).tolist()
        assert t.completion_text == tokenizer.decode(completion, skip_special_tokens=True)
        assert t.reward == ArithmeticTask().reward(prompt, t.completion_text)
        assert t.policy_version == 0 and t.searcher_id == "searcher-test"
        assert t.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert t.created_at_s > 0 and math.isfinite(t.ref_logprob + t.behavior_logprob)


def test_min_version_waits_until_that_version_is_loaded(tmp_path):
    tokenizer, model = load_model(MODEL, 1)
    store = FileStore(f"file://{tmp_path / 'store'}")
    published = publish_weights(store, 1, 2, model, tokenizer)
    calls = []

    def latest():
        calls.append(1)
        return published if len(calls) > 3 else None

    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, latest=latest, min_version=1)
    values = loop.round()
    assert len(calls) == 4
    assert values is not None and values["searcher/version"] == 1
    assert values["searcher/reloads"] == 1
    assert {t.policy_version for t in buffer.posted()} == {1}


def test_stopping_while_waiting_for_min_version_ends_the_round(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loops: list[SearcherLoop] = []

    def latest():
        loops[0].stop.set()

    loops.append(make_loop(tmp_path, buffer, latest=latest, min_version=1))
    assert loops[0].run() == 0
    assert not buffer.attempts


def test_sync_generates_one_round_per_version(tmp_path):
    store = FileStore(f"file://{tmp_path / 'store'}")
    versions = []
    for v in (1, 2):
        tokenizer, model = load_model(MODEL, v)
        versions.append(publish_weights(store, v, v, model, tokenizer))
    announced = [versions[0]] * 4 + [versions[1]]

    def latest():
        return announced.pop(0) if len(announced) > 1 else announced[0]

    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, latest=latest, sync=True, max_rounds=2)
    assert loop.run() == 2
    assert not announced[1:]  # the second round waited through the repeats of version 1
    assert [{t.policy_version for t in batch} for batch, _, _ in buffer.adds] == [{1}, {2}]
