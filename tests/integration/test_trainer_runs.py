"""`tba trainer run` registers its run with a real buffer: a restart from its checkpoint
folder is the same run, a new run on a buffer that holds another is refused naming what
differs, and nothing of the refused trainer reaches the buffer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tests.integration.test_trainer_service import MODEL, add_searcher_round


def trainer(
    address: str, root: Path, checkpoints: Path, *settings: str
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tba", "trainer", "run", "--buffer", address, "--steps", "1"]
    command += ["--store", f"file://{root / 'store'}", "--checkpoint-dir", str(checkpoints)]
    values = [
        f"model.tiny_{k}={getattr(MODEL, f'tiny_{k}')}"
        for k in ("layers", "width", "heads", "positions")
    ]
    values += ["trainer.num_prompts=3", "trainer.samples_per_prompt=4", "trainer.device=cpu"]
    values += ["searcher.temperature=0.7", "metrics.stdout=false", *settings]
    for value in values:
        command += ["--set", value]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, timeout=540, env=env, capture_output=True, text=True)


def test_a_resumed_trainer_is_the_same_run_and_a_new_one_is_refused(buffer_address, tmp_path):
    with BufferClient(BufferClientSettings(address=buffer_address, retries=2)) as client:
        add_searcher_round(client)
        first = trainer(buffer_address, tmp_path, tmp_path / "ckpt")
        assert first.returncode == 0, first.stderr[-5000:]
        run = client.stats().run
        assert run is not None and run.identity.task_name == "arithmetic"
        assert (tmp_path / "ckpt" / "RUN").read_text() == run.run_id
        assert run.identity.temperature == 0.7 and run.identity.max_new_tokens == 512

        resumed = trainer(buffer_address, tmp_path, tmp_path / "ckpt")
        assert resumed.returncode == 0, resumed.stderr[-5000:]
        assert f"run {run.run_id} registered with the buffer" in resumed.stderr
        assert client.stats().run == run

        version = client.latest_weights()
        fresh = trainer(buffer_address, tmp_path, tmp_path / "other-ckpt")
        assert fresh.returncode != 0
        assert f"trainer refused by the buffer: the buffer holds run {run.run_id}" in fresh.stderr
        assert "(same identity)" in fresh.stderr

        changed = trainer(buffer_address, tmp_path, tmp_path / "ckpt", "searcher.max_new_tokens=8")
        assert changed.returncode != 0
        assert "max_new_tokens: the run has 512, this has 8" in changed.stderr
        assert client.stats().run == run and client.latest_weights() == version
