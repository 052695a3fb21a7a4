"""The searcher against a real buffer service (`tba buffer serve` subprocess) and a file://
store: what arrives in the buffer, hot-reloading a published version, refusing a corrupt one,
and `tba searcher run` as a process (rounds, SIGTERM)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import FinishReason, SampleSpec, Trajectory, unpack_tokens
from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.models.logprobs import sequence_logprobs
from tba.objectstore.config import ObjectStoreSettings
from tba.objectstore.local import FileStore
from tba.objectstore.weights import publish_weights, version_key
from tba.searcher.config import EngineSettings, SearcherRunSettings, SearcherSettings
from tba.searcher.main import Searcher, build_searcher
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split
from tba.tasks.config import ArithmeticSettings, TaskSettings
from tests.fixtures.runs import run_of

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)
TASK = TaskSettings(arithmetic=ArithmeticSettings(min_operand=10, max_operand=12, test_size=2))
TEMPERATURE = 0.7
MAX_NEW_TOKENS = 6
SEARCHER_ID = "searcher-it"
RUN = run_of(MODEL, TASK, TEMPERATURE, MAX_NEW_TOKENS)


@pytest.fixture
def client(buffer_address: str) -> Iterator[BufferClient]:
    with BufferClient(BufferClientSettings(address=buffer_address, retries=2)) as c:
        yield c


def run_settings(address: str, root: Path, **searcher: Any) -> SearcherRunSettings:
    options = {
        "id": SEARCHER_ID,
        "prompts_per_round": 4,
        "samples_per_prompt": 3,
        "max_new_tokens": MAX_NEW_TOKENS,
        "temperature": TEMPERATURE,
        "weights_dir": str(root / "searcher-weights"),
        "idle_poll_s": 0.05,
        "max_rounds": 2,
    }
    return SearcherRunSettings(
        searcher=SearcherSettings(**{**options, **searcher}),
        engine=EngineSettings(device="cpu"),
        model=MODEL,
        task=TASK,
        client=BufferClientSettings(address=address, retries=2),
        objectstore=ObjectStoreSettings(uri=f"file://{root / 'store'}"),
    )


@pytest.fixture
def searcher(buffer_address: str, client: BufferClient, tmp_path: Path) -> Iterator[Searcher]:
    client.register_run(RUN)
    built = build_searcher(run_settings(buffer_address, tmp_path))
    assert built is not None
    yield built
    built.close()


def stored(client: BufferClient) -> list[Trajectory]:
    """Every trajectory in a small buffer: the newest of each prompt, all prompts."""
    spec = SampleSpec(num_prompts=100, samples_per_prompt=100, recency_probability=1.0)
    return [t for g in client.sample(spec).groups for t in g.trajectories]


def logprobs_under(seed: int, trajectories: list[Trajectory]) -> torch.Tensor:
    tokenizer, model = load_model(MODEL, seed)
    with torch.no_grad():
        return sequence_logprobs(
            model,
            [unpack_tokens(t.prompt_token_ids).tolist() for t in trajectories],
            [unpack_tokens(t.completion_token_ids).tolist() for t in trajectories],
            TEMPERATURE,
            tokenizer.pad_token_id,
        )


def test_trajectories_arrive_with_every_field_right(searcher, client):
    started_s = time.time()
    assert searcher.loop.run() == 2
    trajectories = stored(client)
    assert trajectories
    task = ArithmeticTask(TASK.arithmetic)
    prompts = {p.id: p for p in task.prompts(Split.TRAIN)}
    tokenizer, _ = load_model(MODEL, 0)
    for t in trajectories:
        prompt = prompts[t.prompt_id]
        assert unpack_tokens(t.prompt_token_ids).tolist() == tokenizer.encode(prompt.text)
        completion = unpack_tokens(t.completion_token_ids).tolist()
        assert t.completion_text == tokenizer.decode(completion, skip_special_tokens=True)
        assert t.reward == task.reward(prompt, t.completion_text)
        stops = completion[-1] == tokenizer.eos_token_id
        assert t.finish_reason == (FinishReason.STOP if stops else FinishReason.LENGTH)
        assert (t.policy_version, t.searcher_id) == (0, SEARCHER_ID)
        assert started_s <= t.created_at_s <= time.time()
    reference = logprobs_under(0, trajectories)
    torch.testing.assert_close(torch.tensor([t.ref_logprob for t in trajectories]), reference)
    # Version 0 is the base model itself: behaviour and reference agree.
    behaviour = torch.tensor([t.behavior_logprob for t in trajectories])
    torch.testing.assert_close(behaviour, reference, atol=1e-4, rtol=0)
    stats = client.stats()
    assert stats.leases_in_flight == 0
    assert [s.searcher_id for s in stats.searchers] == [SEARCHER_ID]
    assert stats.prompts == len(prompts)


def publish(root: Path, version: int, seed: int) -> Any:
    tokenizer, model = load_model(MODEL, seed)
    return publish_weights(
        FileStore(f"file://{root / 'store'}"), version, version, model, tokenizer
    )


def test_a_published_version_is_loaded_and_carried_by_later_trajectories(
    searcher, client, tmp_path
):
    first = searcher.loop.round()
    assert first is not None and first["searcher/version"] == 0
    client.announce_weights(publish(tmp_path, 1, seed=1))
    # The round that sees the announcement generates on with version 0 while version 1
    # downloads; the next one swaps it in.
    second = searcher.loop.round()
    assert second is not None
    assert (second["searcher/version"], second["searcher/reloads"]) == (0, 0)
    assert second["searcher/latest_version"] == 1
    assert searcher.weights.wait_fetch(60.0)
    third = searcher.loop.round()
    assert third is not None
    assert (third["searcher/version"], third["searcher/reloads"]) == (1, 1)
    assert third["searcher/fetch_s"] > 0 and 0 <= third["searcher/swap_s"] < 1.0
    assert searcher.engine.version == 1
    assert set(client.stats().per_version) == {0, 1}
    newer = [t for t in stored(client) if t.policy_version == 1]
    assert len(newer) == third["searcher/trajectories"]
    behaviour = torch.tensor([t.behavior_logprob for t in newer])
    torch.testing.assert_close(behaviour, logprobs_under(1, newer), atol=1e-4, rtol=0)
    # The reference stays the base model, whatever the policy loaded.
    reference = torch.tensor([t.ref_logprob for t in newer])
    torch.testing.assert_close(reference, logprobs_under(0, newer))


def test_a_corrupt_published_version_is_refused_and_the_old_weights_kept(
    searcher, client, tmp_path, caplog
):
    announced = publish(tmp_path, 1, seed=1)
    weights_file = tmp_path / "store" / version_key(1) / "model.safetensors"
    data = weights_file.read_bytes()
    staging = weights_file.with_suffix(".new")
    staging.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    os.replace(staging, weights_file)
    client.announce_weights(announced)

    for _ in range(2):  # the first round starts the download, the second sees it refused
        values = searcher.loop.round()
        assert values is not None and values["searcher/version"] == 0
        assert values["searcher/version_lag"] == 1
        searcher.weights.wait_fetch(60.0)
    assert "does not match its sha256" in caplog.text
    assert {t.policy_version for t in stored(client)} == {0}

    client.announce_weights(publish(tmp_path, 2, seed=2))
    searcher.loop.round()  # starts fetching version 2
    assert searcher.weights.wait_fetch(60.0)
    values = searcher.loop.round()
    assert values is not None and values["searcher/version"] == 2


CLI_TASK = TaskSettings(arithmetic=ArithmeticSettings(max_operand=20, test_size=10))
CLI_RUN = run_of(MODEL, CLI_TASK, 1.0, 4, run_id="cli-run")


def searcher_command(address: str, root: Path, rounds: int, *settings: str) -> list[str]:
    """`tba searcher run` with the buffer's address and per-replica settings only: the task,
    model, temperature and completion length come from the run."""
    command = [sys.executable, "-m", "tba", "searcher", "run", "--buffer", address]
    command += ["--rounds", str(rounds), "--store", f"file://{root / 'store'}"]
    for key, value in {
        "searcher.id": "cli-searcher",
        "searcher.prompts_per_round": 4,
        "searcher.samples_per_prompt": 2,
        "searcher.weights_dir": root / "weights",
        "searcher.idle_poll_s": 0.2,
        "engine.device": "cpu",
    }.items():
        command += ["--set", f"{key}={value}"]
    for setting in settings:
        command += ["--set", setting]
    return command


def test_a_searcher_waits_for_the_run_then_joins_and_tags_its_trajectories(
    buffer_address, client, tmp_path
):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        searcher_command(buffer_address, tmp_path, rounds=2),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        while "waiting for a run" not in proc.stderr.readline():
            assert proc.poll() is None
        client.register_run(CLI_RUN)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-5000:]
    assert "searcher ready: id cli-searcher, engine transformers, version 0" in stdout
    assert "run cli-run" in stdout
    stats = client.stats()
    assert stats.prompts == 11 * 11 - 10  # the run's task, not the searcher's default
    (info,) = stats.searchers
    assert info.searcher_id == "cli-searcher" and info.trajectories_added > 0
    assert stats.leases_in_flight == 0
    assert stats.run is not None and stats.run.run_id == "cli-run"
    completions = [unpack_tokens(t.completion_token_ids) for t in stored(client)]
    assert completions and max(len(c) for c in completions) <= 4  # the run's max_new_tokens


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("searcher.temperature=0.5", "temperature: the run has 1.0, this has 0.5"),
        ("task.name=gsm8k", "task_name: the run has 'arithmetic', this has 'gsm8k'"),
        ("model.tiny_width=64", "model_revision: the run has 'sha256:"),
    ],
)
def test_a_searcher_whose_settings_contradict_the_run_exits_naming_the_field(
    buffer_address, client, tmp_path, setting, field
):
    client.register_run(CLI_RUN)
    done = subprocess.run(
        searcher_command(buffer_address, tmp_path, 1, setting),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "searcher refused by the buffer" in done.stderr and field in done.stderr
    assert client.stats().trajectories_added_total == 0


def test_sigterm_finishes_the_round_and_exits_cleanly(buffer_address, client, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    client.register_run(CLI_RUN)
    proc = subprocess.Popen(
        searcher_command(buffer_address, tmp_path, rounds=0),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "searcher ready" in proc.stdout.readline()
        while client.stats().trajectories_added_total == 0:
            assert proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-5000:]
    assert "stopping after the round in progress" in stderr
    assert client.stats().leases_in_flight == 0
    assert not math.isnan(client.stats().reward_mean)
