"""`tba trainer run` as a process against a real buffer service and a file:// store: it
trains on what searchers added, publishes and announces versions, checkpoints, and a restart
resumes without reusing a version."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, Trajectory, WeightVersion, new_request_id, pack_tokens
from tba.models.config import ModelSettings
from tba.models.logprobs import sequence_logprobs
from tba.objectstore.local import FileStore
from tba.objectstore.weights import fetch_weights, read_latest
from tba.trainer.model import load_policy
from tests.fixtures.buffer_service import start_buffer

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)
TEMPERATURE = 0.7


@pytest.fixture
def client(buffer_address):
    with BufferClient(BufferClientSettings(address=buffer_address, retries=2)) as c:
        yield c


def add_searcher_round(
    client: BufferClient, prompts: int = 4, per_prompt: int = 4, run_id: str = ""
) -> None:
    """What a searcher adds for the starting policy (version 0): distinct completions with
    their reference and behaviour log-probs under the trainer's own starting weights (tagged
    with `run_id` once a trainer has registered a run)."""
    tokenizer, model = load_policy(MODEL, seed=0)
    ids = client.put_prompts([Prompt(f"q{i}", f"{i}+{i}=", str(2 * i)) for i in range(prompts)])
    gen = torch.Generator().manual_seed(5)
    for pid in ids.prompt_ids:
        prompt = tokenizer(f"{pid}=").input_ids
        completions = [
            [*torch.randint(4, 20, (1 + j,), generator=gen).tolist(), tokenizer.eos_token_id]
            for j in range(per_prompt)
        ]
        with torch.no_grad():
            logp = sequence_logprobs(
                model, [prompt] * per_prompt, completions, TEMPERATURE, tokenizer.pad_token_id
            )
        trajectories = [
            Trajectory(
                prompt_id=pid,
                prompt_token_ids=pack_tokens(prompt),
                completion_token_ids=pack_tokens(c),
                completion_text=tokenizer.decode(c),
                reward=float(j % 2),
                ref_logprob=float(lp),
                behavior_logprob=float(lp),
                policy_version=0,
                created_at_s=time.time(),
            )
            for j, (c, lp) in enumerate(zip(completions, logp, strict=True))
        ]
        client.add_trajectories(
            trajectories, searcher_id="s1", request_id=new_request_id(), run_id=run_id
        )


def run_trainer(
    address: str, root: Path, steps: int, launcher: list[str] | None = None, **settings: object
) -> list[dict]:
    """Runs `tba trainer run` (under `launcher` if given) and returns its metrics lines."""
    command = trainer_command(address, root, steps, launcher, **settings)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, timeout=540, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return metrics_lines(root)


def metrics_lines(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]


def trainer_command(
    address: str, root: Path, steps: int, launcher: list[str] | None = None, **settings: object
) -> list[str]:
    prefix = launcher or [sys.executable, "-m"]
    command = [*prefix, "tba", "trainer", "run", "--buffer", address, "--steps", str(steps)]
    command += ["--store", f"file://{root / 'store'}", "--checkpoint-dir", str(root / "ckpt")]
    command += ["--metrics-jsonl", str(root / "metrics.jsonl")]
    for key, value in {
        "model.tiny_layers": MODEL.tiny_layers,
        "model.tiny_width": MODEL.tiny_width,
        "model.tiny_heads": MODEL.tiny_heads,
        "model.tiny_positions": MODEL.tiny_positions,
        "trainer.num_prompts": 3,
        "trainer.samples_per_prompt": 4,
        "trainer.micro_batch_size": 3,
        "searcher.temperature": TEMPERATURE,
        "trainer.recency_probability": 0.5,
        "trainer.publish_every_steps": 2,
        "trainer.device": "cpu",
        "optim.lr": 1e-3,
        "checkpoint.every_steps": 2,
        "metrics.stdout": "false",
        **settings,
    }.items():
        command += ["--set", f"{key}={value}"]
    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def published_tensors(root: Path) -> dict[str, torch.Tensor]:
    store = FileStore(f"file://{root / 'store'}")
    latest = read_latest(store)
    assert latest is not None
    local = fetch_weights(store, latest, root / "fetched")
    return dict(AutoModelForCausalLM.from_pretrained(local).state_dict())


@pytest.mark.parametrize("background", [False, True], ids=["lockstep", "background"])
def test_trainer_trains_from_the_buffer_publishes_and_resumes(
    client, buffer_address, tmp_path, background
):
    add_searcher_round(client)
    mode = {"trainer.publish_in_background": str(background).lower()}
    metrics = run_trainer(buffer_address, tmp_path, steps=4, **mode)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    skipped = int(metrics[-1]["trainer/publish_skipped"])
    if not background:
        # initial weights = version 1; a version every 2 steps; data is version 0
        assert [m["trainer/staleness_mean"] for m in metrics] == [1.0, 1.0, 2.0, 2.0]
        assert skipped == 0
    assert all(m["trainer/samples"] == 12 and m["trainer/groups"] == 3 for m in metrics)
    assert all(m["trainer/publish_failed"] == 0 for m in metrics)
    announced = client.latest_weights()
    # A snapshot replaced while the one before was uploading takes no version number.
    assert announced is not None and (announced.version, announced.step) == (3 - skipped, 4)
    store = FileStore(f"file://{tmp_path / 'store'}")
    assert read_latest(store) == announced
    model = AutoModelForCausalLM.from_pretrained(fetch_weights(store, announced, tmp_path / "v3"))
    assert model.config.n_layer == MODEL.tiny_layers

    # A publish the checkpoint never heard of (died between announce and checkpoint).
    client.announce_weights(
        WeightVersion(7, announced.uri, announced.sha256, 4, announced.published_at_s)
    )
    metrics = run_trainer(buffer_address, tmp_path, steps=6, **mode)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]  # resumed at step 4
    latest = client.latest_weights()
    assert latest is not None and (latest.version, latest.step) == (8, 6)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == [
        "step-00000004",
        "step-00000006",
    ]


def start_trainer(address: str, root: Path, steps: int, **settings: object) -> subprocess.Popen:
    """`tba trainer run` in the background, its output in root/trainer.log."""
    root.mkdir(parents=True, exist_ok=True)
    command = trainer_command(address, root, steps, **settings)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with (root / "trainer.log").open("w") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_for_log(root: Path, text: str, trainer: subprocess.Popen, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and trainer.poll() is None:
        log = (root / "trainer.log").read_text()
        if text in log:
            return log
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in the trainer's log:\n{(root / 'trainer.log').read_text()}")


def test_a_fresh_trainer_waits_for_the_initial_fill_then_trains(client, buffer_address, tmp_path):
    trainer = start_trainer(
        buffer_address, tmp_path, steps=2, **{"trainer.initial_buffer_completions": 16}
    )
    try:
        wait_for_log(tmp_path, "waiting for the initial buffer fill: 0 of 16", trainer)
        stats = client.stats()
        assert stats.run is not None and stats.trajectories == 0
        add_searcher_round(client, prompts=4, per_prompt=4, run_id=stats.run.run_id)
        assert trainer.wait(timeout=300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        trainer.kill()
    metrics = metrics_lines(tmp_path)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert metrics[0]["trainer/initial_fill_completions"] == 16
    assert metrics[0]["time/initial_fill_s"] > 0
    # Resumed past step 0 (its checkpoint at step 2): no wait, however full the buffer.
    resumed = run_trainer(
        buffer_address, tmp_path, steps=3, **{"trainer.initial_buffer_completions": 1000}
    )
    assert [m["step"] for m in resumed] == [0, 1, 2, 3]


def test_a_shutdown_while_waiting_for_the_initial_fill_exits_cleanly(buffer_address, tmp_path):
    trainer = start_trainer(
        buffer_address, tmp_path, steps=2, **{"trainer.initial_buffer_completions": 10_000}
    )
    try:
        wait_for_log(tmp_path, "waiting for the initial buffer fill: 0 of 10000", trainer)
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(timeout=60) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        trainer.kill()
    log = (tmp_path / "trainer.log").read_text()
    assert "trainer stopped before its first step" in log and "Traceback" not in log
    assert metrics_lines(tmp_path) == [] and list((tmp_path / "ckpt").glob("step-*")) == []


@pytest.mark.slow
def test_two_deepspeed_ranks_match_one_process_on_the_same_batches(tmp_path):
    """Same buffer content and seeded draws: the loss of each step and the weights after two
    steps agree between one process and two gloo ranks under ZeRO-2 and ZeRO-3."""
    runs = {}
    for name, stage in (("single", None), ("zero2", 2), ("zero3", 3)):
        root = tmp_path / name
        root.mkdir()
        service = start_buffer(root)
        try:
            with BufferClient(BufferClientSettings(address=service.address)) as c:
                add_searcher_round(c)
            if stage is None:
                runs[name] = run_trainer(service.address, root, steps=2)
            else:
                launcher = [
                    str(Path(sys.executable).with_name("deepspeed")),
                    "--num_accelerators",
                    "2",
                    "--master_port",
                    str(free_port()),
                    "--no_local_rank",
                    "--module",
                ]
                runs[name] = run_trainer(
                    service.address,
                    root,
                    steps=2,
                    launcher=launcher,
                    **{"distributed.backend": "deepspeed", "distributed.zero_stage": stage},
                )
        finally:
            service.stop()
    single = published_tensors(tmp_path / "single")
    for name in ("zero2", "zero3"):
        for ours, theirs in zip(runs["single"], runs[name], strict=True):
            assert theirs["trainer/loss"] == pytest.approx(ours["trainer/loss"], rel=1e-4)
            assert theirs["trainer/grad_norm"] == pytest.approx(ours["trainer/grad_norm"], rel=1e-3)
        for key, tensor in published_tensors(tmp_path / name).items():
            torch.testing.assert_close(tensor, single[key], rtol=1e-4, atol=1e-5)
