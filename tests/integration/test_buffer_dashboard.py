"""The dashboard page renders live stats in a real headless Chromium."""

import shutil
import subprocess

import httpx

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, new_request_id
from tba.runs import Run, RunIdentity
from tests.fixtures.data import trajectory

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium(tmp_path, *args):
    binary = shutil.which("chromium")
    assert binary, "chromium is installed by scripts/install.sh"
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


RUN = Run("run-dashboard", RunIdentity("gpt2", "c0ffee", "a" * 64, "arithmetic", "b" * 64, 0.7, 9))


def test_dashboard_shows_buffer_size_rewards_searchers_and_the_run(buffer_service, tmp_path):
    with BufferClient(BufferClientSettings(address=buffer_service.address)) as client:
        client.register_run(RUN)
        (pid,) = client.put_prompts([Prompt("", "1+2=", "3")]).prompt_ids
        batch = [trajectory(pid, completion=[4, k], reward=k / 10) for k in range(7)]
        client.add_trajectories(
            batch, searcher_id="searcher-abc", request_id=new_request_id(), run_id=RUN.run_id
        )
    page = httpx.get(buffer_service.http_url + "/", timeout=10)
    assert page.status_code == 200 and "TBA replay buffer" in page.text
    dom = _chromium(
        tmp_path, "--virtual-time-budget=5000", "--dump-dom", buffer_service.http_url
    ).stdout
    assert '<div class="value" id="trajectories">7</div>' in dom
    assert '<div class="value" id="prompts">1</div>' in dom
    assert "searcher-abc" in dom
    assert "<td>run id</td><td>run-dashboard</td>" in dom
    assert "<td>task_name</td><td>arithmetic</td>" in dom
    assert dom.count('class="bar"') == 20
    assert '<div id="status" class="">updated' in dom
    _chromium(
        tmp_path,
        "--virtual-time-budget=5000",
        f"--screenshot={tmp_path / 'dashboard.png'}",
        "--window-size=1200,900",
        buffer_service.http_url,
    )
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
