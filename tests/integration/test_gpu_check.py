"""The GPU check script's dry run: the same flow as on a GPU (one run file, buffer, bf16
trainer, searcher, hot reload, learning direction) on CPU, so the script cannot rot while no
GPU is at hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]
CHECKS = [
    "run-file",
    "transformers/run",
    "transformers/trainer-device",
    "transformers/searcher-0-device",
    "transformers/hot-reload",
    "transformers/learning",
]


def test_the_gpu_check_dry_run_passes_every_check(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TBA_")}
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "PYTHON": sys.executable, "GPU_CHECK_DEVICE": "cpu"},
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    verdicts = {
        line.split(" ", 2)[1].rstrip(":"): line.split(" ", 1)[0]
        for line in done.stdout.splitlines()
        if line.startswith(("PASS ", "FAIL ", "SKIP "))
    }
    assert {name: verdicts.get(name) for name in CHECKS} == dict.fromkeys(CHECKS, "PASS")
    assert verdicts["vllm"] == "SKIP"
    assert (tmp_path / "run-transformers.toml").is_file()


def test_the_gpu_check_names_what_is_missing_before_running(tmp_path):
    """A Python without tba's dependencies gets one FAIL line naming them all."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": str(venv / "bin" / "python")},
        check=False,
    )
    assert done.returncode != 0
    assert done.stdout.startswith("FAIL imports: missing torch, pydantic")
