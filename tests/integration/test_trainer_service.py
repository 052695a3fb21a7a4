"""`tba trainer run` as a process against a real buffer service and a file:// store: it
trains on what searchers added, publishes and announces versions, checkpoints, and a restart
resumes without reusing a version."""

from __future__ import annotations

import json
import os
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


def add_searcher_round(client: BufferClient, prompts: int = 4, per_prompt: int = 4) -> None:
    """What a searcher adds for the starting policy (version 0): distinct completions with
    their reference and behaviour log-probs under the trainer's own starting weights."""
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
        client.add_trajectories(trajectories, searcher_id="s1", request_id=new_request_id())


def run_trainer(
    address: str, root: Path, steps: int, launcher: list[str] | None = None, **settings: object
) -> list[dict]:
    """Runs `tba trainer run` (under `launcher` if given) and returns its metrics lines."""
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
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, timeout=540, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    lines = (root / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


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
