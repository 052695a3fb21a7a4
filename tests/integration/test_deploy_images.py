"""What the images and compose run, against real servers (no Docker engine needed): the
buffer's container health check against a real buffer service, the object store's
bucket-creation script against a real SeaweedFS, and the buffer extra's dependency closure
(the buffer image must not contain torch).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from subprocess import PIPE

import pytest
from packaging.requirements import Requirement

from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.deploy_settings import run_tool
from tests.fixtures.seaweedfs import SeaweedServer, weed_binary

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "services/buffer/healthcheck.py"
CREATE_BUCKET = ROOT / "deploy/compose/create-bucket.sh"
SCRIPT_TIMEOUT_S = 240
FORBIDDEN_IN_BUFFER = {"torch", "transformers", "vllm", "deepspeed", "nvidia-cudnn-cu12"}


def test_buffer_healthcheck_tells_serving_from_down(buffer_service: BufferProcess) -> None:
    serving = run_tool([sys.executable, str(HEALTHCHECK), buffer_service.address])
    assert serving.returncode == 0, serving.stderr
    buffer_service.stop()
    down = run_tool([sys.executable, str(HEALTHCHECK), buffer_service.address])
    assert down.returncode == 1
    assert "UNAVAILABLE" in down.stderr


def test_buffer_healthcheck_takes_the_port_from_the_settings_variable(
    buffer_service: BufferProcess,
) -> None:
    env = {**os.environ, "TBA_BUFFER__GRPC_PORT": str(buffer_service.grpc_port)}
    result = run_tool([sys.executable, str(HEALTHCHECK)], env=env)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def seaweed_store(tmp_path: Path) -> Iterator[SeaweedServer]:
    """A SeaweedFS on free ports, not started yet; killed at the end."""
    store = SeaweedServer(tmp_path)
    try:
        yield store
    finally:
        store.kill()


def _bucket_script(master: str, bucket: str) -> subprocess.Popen[str]:
    weed_dir = str(Path(weed_binary()).parent)
    env = {"PATH": f"{weed_dir}:{os.environ['PATH']}", "SEAWEED_MASTER": master, "BUCKET": bucket}
    return subprocess.Popen(
        ["sh", str(CREATE_BUCKET)], env=env, text=True, stdout=PIPE, stderr=PIPE
    )


def _finished(script: subprocess.Popen[str]) -> str:
    """The script's output once it exits 0; it gives up on its own after 15 tries of ~12 s."""
    try:
        out, err = script.communicate(timeout=SCRIPT_TIMEOUT_S)
    finally:
        script.kill()
    assert script.returncode == 0, out + err
    return out


def test_create_bucket_script_waits_for_the_store_and_is_idempotent(
    seaweed_store: SeaweedServer,
) -> None:
    ports = seaweed_store.ports
    # host:port.grpc_port, how `weed shell` is told a gRPC port that is not port + 10000.
    master = f"127.0.0.1:{ports['master.port']}.{ports['master.port.grpc']}"
    first = _bucket_script(master, "tba-weights")  # before the store: it must wait
    seaweed_store.start()
    assert "created bucket tba-weights" in _finished(first)
    assert "bucket tba-weights exists" in _finished(_bucket_script(master, "tba-weights"))
    listing = run_tool([weed_binary(), "shell", f"-master={master}"], input="s3.bucket.list\n")
    assert "tba-weights" in listing.stdout


def _closure(requirement: Requirement) -> set[str]:
    """Names of the installed distributions that `requirement` pulls in, transitively."""
    names: set[str] = set()
    done: set[tuple[str, str]] = set()
    todo = [(requirement, "")]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        names.add(name)
        # A distribution is walked once per extra it is asked for (tba[trainer] -> tba[ml]).
        for wanted in {"", *req.extras} - {e for n, e in done if n == name}:
            done.add((name, wanted))
            todo += [(Requirement(r), wanted) for r in metadata.requires(name) or []]
    return names


def test_buffer_extra_pulls_in_no_torch() -> None:
    """`pip install .[buffer]` (services/buffer/Dockerfile) must stay free of the ML stack."""
    closure = _closure(Requirement("tba[buffer]"))
    assert {"redis", "fastapi", "uvicorn", "grpcio"} <= closure
    assert closure.isdisjoint(FORBIDDEN_IN_BUFFER), closure & FORBIDDEN_IN_BUFFER
    assert "torch" in _closure(Requirement("tba[trainer]"))
