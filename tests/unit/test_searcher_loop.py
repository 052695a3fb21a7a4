"""The searcher loop's own logic on a tiny real engine, reference and weight sync, with an
in-process buffer that records what is posted (and can fail) where the point is the loop:
de-duplication, the reward guard, chunking and retries, skipped prompts, min_version, and
rounds whose finish (reward, reference, posting) overlaps the next round's generation."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tba.buffer.config import BufferSettings
from tba.buffer.validation import check_trajectory
from tba.domain import (
    AddResult,
    FinishReason,
    Lease,
    Prompt,
    Trajectory,
    unpack_logprobs,
    unpack_tokens,
)
from tba.errors import UnavailableError
from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.objectstore.local import FileStore
from tba.objectstore.weights import publish_weights
from tba.searcher.config import EngineSettings, SearcherSettings
from tba.searcher.engine import SamplingParams
from tba.searcher.finish import ReferenceLogprobs
from tba.searcher.hf_engine import TransformersEngine
from tba.searcher.loop import SearcherLoop
from tba.searcher.metrics import SearcherMetrics
from tba.searcher.reference import ReferenceScorer
from tba.searcher.settled import SettledPrompts
from tba.searcher.weights import WeightSync
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import make_prompt
from tba.tasks.diversity import mean_pairwise_ngram_distance
from tests.unit.test_searcher_weights import HeldStore

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)
PROMPTS = [make_prompt("arithmetic", f"{a}+{a}=", str(2 * a)) for a in (11, 12, 13)]


@dataclass
class RecordingBuffer:
    """Leases `prompts` under `lease-1`; records each add attempt; the first `failures`
    attempts fail as an unavailable buffer does once the client's retries are spent."""

    prompts: list[Prompt]
    failures: int = 0
    attempts: list[str] = field(default_factory=list)
    searchers: list[str] = field(default_factory=list)
    adds: list[tuple[list[Trajectory], str, str]] = field(default_factory=list)

    def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float = 0.0) -> Lease:
        taken = self.prompts[:max_prompts]
        return Lease("lease-1" if taken else "", taken, 0.0)

    def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        *,
        searcher_id: str,
        request_id: str,
        lease_id: str = "",
    ) -> AddResult:
        assert request_id
        self.attempts.append(request_id)
        self.searchers.append(searcher_id)
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
    store: FileStore | None = None,
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
        store or FileStore(f"file://{tmp_path / 'store'}"),
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
        reference=ReferenceScorer(
            base, tokenizer.pad_token_id, 5, cache_tokens=s.reference_cache_tokens
        ),
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
    # Diversity is of what the policy drew, duplicates included: one answer in four, no
    # distance between equal completions.
    assert values["searcher/distinct_answer_ratio"] == 0.25
    assert values["searcher/pairwise_distance"] == 0.0


def test_a_prompts_completions_scored_in_an_earlier_round_are_looked_up(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, drop_duplicates=False, reference_cache_tokens=1000)
    first, second = loop.round(), loop.round()
    assert first is not None and first["searcher/reference_looked_up"] == 0
    assert second is not None and second["searcher/reference_looked_up"] == 12
    posted = buffer.posted()
    assert [t.ref_logprob for t in posted[12:]] == [t.ref_logprob for t in posted[:12]]


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


class BatchedReward:
    """A model-based task: one batched call per round, told which completions finished."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[bool]]] = []

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        raise AssertionError("the batched path must be used")

    def rewards(self, prompts, completion_texts, finished):  # type: ignore[no-untyped-def]
        self.calls.append((len(prompts), list(finished)))
        return [0.25 * i for i in range(len(prompts))]


def test_rewards_are_scored_in_one_batch_with_finished_flags(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    task = BatchedReward()
    loop = make_loop(tmp_path, buffer, task=task)
    assert loop.round() is not None
    ((count, finished),) = task.calls
    assert count == len(buffer.posted()) and all(finished)
    assert [t.reward for t in buffer.posted()] == [0.25 * i for i in range(count)]


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
    # Each batch is sent as this searcher's; the buffer files its trajectories under it.
    assert buffer.searchers == ["searcher-test"] * 2
    tokenizer = loop.engine.tokenizer  # type: ignore[attr-defined]
    for t in buffer.posted():
        prompt = next(p for p in PROMPTS if p.id == t.prompt_id)
        assert unpack_tokens(t.prompt_token_ids).tolist() == tokenizer.encode(prompt.text)
        completion = unpack_tokens(t.completion_token_ids).tolist()
        assert t.completion_text == tokenizer.decode(completion, skip_special_tokens=True)
        assert t.reward == ArithmeticTask().reward(prompt, t.completion_text)
        assert t.policy_version == 0
        assert t.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert t.created_at_s > 0 and math.isfinite(t.ref_logprob + t.behavior_logprob)
        # Per-token log-probs ride along; the buffer's checks (count, finite, sums) pass.
        assert len(unpack_logprobs(t.behavior_token_logprobs)) == len(completion)
        assert len(unpack_logprobs(t.ref_token_logprobs)) == len(completion)
        check_trajectory(t, "t", BufferSettings())


def test_without_token_logprobs_only_the_sums_are_posted(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    make_loop(tmp_path, buffer, token_logprobs=False).round()
    posted = buffer.posted()
    assert posted and all(math.isfinite(t.ref_logprob) for t in posted)
    assert {(t.behavior_token_logprobs, t.ref_token_logprobs) for t in posted} == {(b"", b"")}


def test_each_round_measures_the_diversity_of_its_prompt_groups_for_its_version(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, eos_nats=0.0, drop_duplicates=False)
    values = loop.round()
    posted = buffer.posted()
    assert values is not None and len(posted) == 12 and values["searcher/version"] == 0
    groups = [[t for t in posted if t.prompt_id == p.id] for p in PROMPTS]
    ratios = [len({t.completion_text.strip() for t in group}) / 4 for group in groups]
    distances = [
        mean_pairwise_ngram_distance(
            [unpack_tokens(t.completion_token_ids).tolist() for t in group]
        )
        for group in groups
    ]
    assert values["searcher/distinct_answer_ratio"] == pytest.approx(sum(ratios) / 3)
    assert None not in distances
    expected_distance = sum(d for d in distances if d is not None) / 3
    assert values["searcher/pairwise_distance"] == pytest.approx(expected_distance)
    assert 0 < values["searcher/pairwise_distance"] <= 1
    assert values["searcher/diversity_s"] >= 0
    registry = loop.metrics.registry  # type: ignore[attr-defined]
    for name in ("distinct_answer_ratio", "pairwise_distance"):
        exposed = registry.get_sample_value(f"tba_searcher_{name}")
        assert exposed == pytest.approx(values[f"searcher/{name}"])


def test_min_version_waits_until_that_version_is_loaded(tmp_path):
    tokenizer, model = load_model(MODEL, 1)
    store = FileStore(f"file://{tmp_path / 'store'}")
    published = publish_weights(store, 1, 2, model, tokenizer)
    calls = []

    def latest():
        calls.append(1)
        return published if len(calls) > 3 else None

    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, latest=latest, min_version=1, announce_wait_s=0)
    values = loop.round()
    # Polling: the fourth read starts the download, the wait ends once it is ready, the
    # fifth check swaps it in.
    assert len(calls) == 5
    assert values is not None and values["searcher/version"] == 1
    assert values["searcher/reloads"] == 1
    assert values["searcher/fetch_s"] > 0 and values["searcher/swap_s"] >= 0
    assert values["searcher/reload_s"] >= values["searcher/fetch_s"]
    assert {t.policy_version for t in buffer.posted()} == {1}


class AnnouncingBuffer:
    """GetLatestWeights of a buffer: version 1 once `announced` is set; a long poll waits for
    it (`long_poll`), an older buffer answers at once. Records each call's arguments."""

    def __init__(self, published: Any, long_poll: bool) -> None:
        self.published = published
        self.long_poll = long_poll
        self.announced = threading.Event()
        self.calls: list[tuple[int, float]] = []

    def latest(self, newer_than: int = 0, wait_s: float = 0.0) -> Any:
        self.calls.append((newer_than, wait_s))
        if self.long_poll and wait_s > 0:
            self.announced.wait(wait_s)
        return self.published if self.announced.is_set() else None


def round_after_announcement(
    tmp_path: Path, long_poll: bool, idle_poll_s: float, announced_after_s: float
) -> tuple[dict[str, float] | None, AnnouncingBuffer]:
    """One round of a loop waiting for version 1, announced `announced_after_s` into it."""
    tokenizer, model = load_model(MODEL, 1)
    published = publish_weights(FileStore(f"file://{tmp_path / 'store'}"), 1, 2, model, tokenizer)
    weights = AnnouncingBuffer(published, long_poll)
    loop = make_loop(
        tmp_path,
        RecordingBuffer(PROMPTS),
        latest=weights.latest,
        min_version=1,
        idle_poll_s=idle_poll_s,
        announce_wait_s=30.0,
    )
    threading.Timer(announced_after_s, weights.announced.set).start()
    return loop.round(), weights


def test_a_searcher_waiting_for_a_version_learns_of_it_from_a_long_poll(tmp_path):
    # A poll would first wait the minute of idle_poll_s: the long poll learns of it at once.
    values, weights = round_after_announcement(tmp_path, True, 60.0, announced_after_s=0.2)
    assert values is not None and values["searcher/version"] == 1
    assert weights.calls[:2] == [(0, 0.0), (0, 30.0)]  # the check, then the long poll


def test_against_a_buffer_without_the_long_poll_a_waiting_searcher_polls(tmp_path):
    values, weights = round_after_announcement(tmp_path, False, 0.05, announced_after_s=0.5)
    assert values is not None and values["searcher/version"] == 1
    # Two calls per idle_poll_s while waiting (a long poll answered at once, then a check),
    # not a loop without pause.
    assert (0, 30.0) in weights.calls and len(weights.calls) < 2 * 0.5 / 0.05 + 10


def test_a_round_generates_with_the_old_weights_while_the_new_ones_download(tmp_path):
    store = HeldStore(f"file://{tmp_path / 'store'}")
    tokenizer, model = load_model(MODEL, 1)
    published = publish_weights(store, 1, 2, model, tokenizer)
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, latest=lambda: published, store=store)
    first = loop.round()  # version 1's download is held all along
    assert first is not None and store.downloading.is_set()
    assert (first["searcher/version"], first["searcher/latest_version"]) == (0, 1)
    assert first["searcher/reloads"] == 0 and first["searcher/swap_s"] == 0
    store.released.set()
    assert loop.weights.wait_fetch(60.0)
    second = loop.round()
    assert second is not None
    assert (second["searcher/version"], second["searcher/reloads"]) == (1, 1)
    assert 0 <= second["searcher/swap_s"] <= second["searcher/weights_s"]
    assert {t.policy_version for t in buffer.posted()} == {0, 1}


def test_stopping_while_waiting_for_min_version_ends_the_round(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loops: list[SearcherLoop] = []

    def latest(*_: object) -> None:
        loops[0].stop.set()

    loops.append(make_loop(tmp_path, buffer, latest=latest, min_version=1))
    assert loops[0].run() == 0
    assert not buffer.attempts


def publish_two_versions(tmp_path: Path) -> list[Any]:
    """Weight versions 1 and 2 (different weights) in a file:// store."""
    store = FileStore(f"file://{tmp_path / 'store'}")
    versions = []
    for v in (1, 2):
        tokenizer, model = load_model(MODEL, v)
        versions.append(publish_weights(store, v, v, model, tokenizer))
    return versions


def test_sync_generates_one_round_per_version_after_posting_the_last(tmp_path):
    versions = publish_two_versions(tmp_path)
    buffer = RecordingBuffer(PROMPTS)

    def latest(*_: object) -> Any:  # a buffer without the long poll: answers at once
        # As a trainer does: the next version only once the searcher's round is in.
        return versions[min(len(buffer.adds), 1)]

    loop = make_loop(tmp_path, buffer, latest=latest, one_round_per_version=True, max_rounds=2)
    trace = trace_rounds(loop, buffer, gate=False)
    loop.weights.catch_up()  # type: ignore[attr-defined]  # as `tba searcher run` starts
    assert loop.run() == 2
    assert trace.posted_at_generate == [0, 1]
    assert [{t.policy_version for t in batch} for batch, _, _ in buffer.adds] == [{1}, {2}]


def test_one_round_per_version_overlaps_the_finish_when_the_next_version_is_out(tmp_path):
    versions = publish_two_versions(tmp_path)
    buffer = RecordingBuffer(PROMPTS)

    def latest(*_: object) -> Any:
        # As an asynchronous trainer does: version 2 comes from training on an older round.
        return versions[min(len(trace.posted_at_generate), 1)]

    loop = make_loop(tmp_path, buffer, latest=latest, one_round_per_version=True, max_rounds=2)
    trace = trace_rounds(loop, buffer)
    loop.weights.catch_up()  # type: ignore[attr-defined]
    assert loop.run() == 2
    # Round 1's finish waited for generation 2 to start: version 2 did not wait for its post.
    assert trace.posted_at_generate == [0, 0]
    assert [{t.policy_version for t in batch} for batch, _, _ in buffer.adds] == [{1}, {2}]


@dataclass
class TracingEngine:
    """The loop's engine, calling `before` as each generation starts."""

    inner: Any
    before: Callable[[], None]

    @property
    def version(self) -> int:
        return int(self.inner.version)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Any:
        self.before()
        return self.inner.generate(prompts, params)


@dataclass
class RoundTrace:
    """What a loop did: rounds posted as each generation started, generations started (an
    event each), and the metrics written."""

    posted_at_generate: list[int] = field(default_factory=list)
    generating: list[threading.Event] = field(
        default_factory=lambda: [threading.Event() for _ in range(10)]
    )
    metrics: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def write(self, round_index: int, values: Mapping[str, float]) -> None:
        self.metrics.append((round_index, dict(values)))


@dataclass
class GatedReference:
    """The reference model, except that round k's scoring holds on until generation k + 1
    has started (for k < `last_round`): a loop that does not overlap rounds never gets
    there, and the assertion fails in the finish stage."""

    inner: Any
    trace: RoundTrace
    last_round: int
    calls: int = 0

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[ReferenceLogprobs]:
        self.calls += 1
        if self.calls < self.last_round:
            assert self.trace.generating[self.calls + 1].wait(timeout=120)
        return list(self.inner.score(prompts, completions, temperature))


def trace_rounds(
    loop: SearcherLoop,
    buffer: RecordingBuffer,
    gate: bool = True,
    stop_at_generation: int = 0,
) -> RoundTrace:
    """Records the loop's rounds; with `gate`, each finish waits for the next generation
    (up to `max_rounds`, or the generation during which the loop is stopped)."""
    trace = RoundTrace()

    def before_generate() -> None:
        trace.posted_at_generate.append(len(buffer.adds))
        count = len(trace.posted_at_generate)
        if count == stop_at_generation:
            loop.stop.set()
        trace.generating[count].set()

    loop.engine = TracingEngine(loop.engine, before_generate)
    loop.metrics = trace
    if gate:
        last = stop_at_generation or loop.settings.max_rounds
        loop.reference = GatedReference(loop.reference, trace, last)
    return trace


def test_each_rounds_finish_overlaps_the_next_generation_one_round_at_a_time(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, max_rounds=3)
    trace = trace_rounds(loop, buffer)
    assert loop.run() == 3
    # Round 1 was not posted before generation 2 started (its finish waited for it), and
    # generation 3 started only after round 1 was posted: one round in flight at most.
    assert trace.posted_at_generate == [0, 0, 1]
    assert [lease for _, lease, _ in buffer.adds] == ["lease-1"] * 3
    assert [index for index, _ in trace.metrics] == [1, 2, 3]
    for _, values in trace.metrics:
        assert values["searcher/wait_finish_s"] >= 0
        assert values["searcher/trajectories"] == 3


def test_stopping_posts_the_round_generating_and_the_round_in_flight(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer)
    trace = trace_rounds(loop, buffer, stop_at_generation=2)
    assert loop.run() == 2
    assert trace.posted_at_generate == [0, 0]
    assert [lease for _, lease, _ in buffer.adds] == ["lease-1"] * 2
    assert [index for index, _ in trace.metrics] == [1, 2]


def test_an_error_in_the_finish_stage_is_raised_by_the_loop(tmp_path):
    # Round 1's posting fails while round 2 generates; the loop raises before handing
    # round 2 over, so nothing more is posted or generated.
    buffer = RecordingBuffer(PROMPTS, failures=1)
    loop = make_loop(tmp_path, buffer, add_retries=0, max_rounds=5)
    trace = trace_rounds(loop, buffer, gate=False)
    with pytest.raises(UnavailableError):
        loop.run()
    assert len(trace.posted_at_generate) == 2 and len(buffer.attempts) == 1
    assert not buffer.adds and not trace.metrics

    # The last round's error is raised too, once run() has waited for it.
    last = RecordingBuffer(PROMPTS, failures=1)
    with pytest.raises(UnavailableError):
        make_loop(tmp_path, last, add_retries=0, max_rounds=1).run()
    assert len(last.attempts) == 1


@dataclass
class CountingBuffer(RecordingBuffer):
    """A RecordingBuffer that also records how many prompts each lease asked for."""

    asked: list[int] = field(default_factory=list)

    def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float = 0.0) -> Lease:
        self.asked.append(max_prompts)
        return super().lease_prompts(searcher_id, max_prompts, lease_s)


def test_a_settled_prompt_is_passed_over_at_its_next_lease(tmp_path):
    # Every completion is a lone EOS, rewarded 0: each group settles.
    buffer = CountingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, prompts_per_round=1, settled_prompt_passes=1)
    loop.settled = SettledPrompts(1)
    rounds = [loop.round() for _ in range(3)]
    assert buffer.asked == [2, 2, 2]
    generated = [{t.prompt_id for t in batch} for batch, _, _ in buffer.adds]
    assert generated == [{PROMPTS[0].id}, {PROMPTS[1].id}, {PROMPTS[0].id}]
    assert [r["searcher/passed_over"] for r in rounds if r is not None] == [0, 1, 0]
    assert [lease for _, lease, _ in buffer.adds] == ["lease-1"] * 3


def test_passing_over_settled_prompts_needs_groups_of_two():
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        SearcherSettings(settled_prompt_passes=1, samples_per_prompt=1)


class CountingReference:
    """The real reference scorer, counting the completions it is asked to score."""

    def __init__(self, scorer: ReferenceScorer) -> None:
        self.scorer = scorer
        self.scored = 0

    def score(self, prompts, completions, temperature):  # type: ignore[no-untyped-def]
        self.scored += len(completions)
        return self.scorer.score(prompts, completions, temperature)


def test_k_of_s_are_posted_for_contrast_and_only_they_are_scored(tmp_path):
    buffer = RecordingBuffer(PROMPTS)
    task = BatchedReward()  # rewards 0, 0.25, ... over the round: 0-0.75 for the first prompt
    loop = make_loop(tmp_path, buffer, task=task, drop_duplicates=False, post_per_prompt=2)
    reference = CountingReference(loop.reference)  # type: ignore[arg-type]
    loop.reference = reference
    values = loop.round()
    assert values is not None and values["searcher/not_chosen"] == 6
    assert values["searcher/dropped"] == 0
    assert [t.reward for t in buffer.posted()] == [0.0, 0.75, 1.0, 1.75, 2.0, 2.75]
    assert reference.scored == 6


def test_posting_more_per_prompt_than_generated_is_refused():
    with pytest.raises(ValueError, match="post_per_prompt"):
        SearcherSettings(samples_per_prompt=4, post_per_prompt=8)
