"""The dashboard page renders live stats and the history's curves in a real headless
Chromium."""

import re
import shutil
import subprocess
import time

import httpx

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, SampleSpec, TrainerReport, WeightVersion, new_request_id
from tba.runs import Run, RunIdentity
from tests.fixtures.buffer_service import start_buffer, wait_for_history
from tests.fixtures.data import trajectory

TOKEN = "dashboard-token-0123456789"

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


def _feed_a_run(service, versions: int) -> None:
    """What a short run sends: trajectories of rising reward, the trainer's samples with
    its step metrics, a version announced and evaluated at a time."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    settings = BufferClientSettings(address=service.address, auth_token=TOKEN)
    with BufferClient(settings) as client:
        pids = client.put_prompts([Prompt("", f"{i}+1=", str(i + 1)) for i in range(4)]).prompt_ids
        for version in range(1, versions + 1):
            for n, pid in enumerate(pids):
                batch = [
                    trajectory(pid, completion=[version, n, k], reward=version / versions)
                    for k in range(3)
                ]
                client.add_trajectories(batch, searcher_id="s1", request_id=new_request_id())
            report = TrainerReport(version, 2.0 / version, 0.01 * version, -1.0, 1e-4, 1.0, 0.2, 0)
            client.sample(SampleSpec(2, 2, 0.5, report=report))
            weights = WeightVersion(version, f"file:///w/{version}", "c" * 64, version, time.time())
            client.announce_weights(weights)
            body = {"version": version, "step": version, "metrics": {"accuracy": version / 10}}
            httpx.post(
                f"{service.http_url}/v1/evaluations", json=body, headers=auth, timeout=10
            ).raise_for_status()
            wait_for_history(service.http_url, 1, since=time.time())


def test_dashboard_draws_the_curves_of_the_history(tmp_path):
    args = ["--set", "buffer.history_interval_s=0.2", "--set", f"buffer.auth_token={TOKEN}"]
    service = start_buffer(tmp_path, *args)
    try:
        _feed_a_run(service, versions=4)
        dom = _chromium(
            tmp_path, "--virtual-time-budget=5000", "--dump-dom", service.http_url
        ).stdout
        paths = dict(re.findall(r'data-series="([^"]+)" data-points="(\d+)"', dom))
        for series in ("reward mean", "held-out accuracy", "loss", "KL", "log Z", "adds / s"):
            assert int(paths.get(series, 0)) > 1, (series, paths)
        for series in ("samples / s", "mean", "max"):
            assert int(paths.get(series, 0)) > 1, (series, paths)
        assert int(paths["held-out accuracy"]) == 4
        assert dom.count('class="chart"') == 6
        _chromium(
            tmp_path,
            "--virtual-time-budget=5000",
            f"--screenshot={tmp_path / 'curves.png'}",
            "--window-size=1200,1400",
            service.http_url,
        )
        assert (tmp_path / "curves.png").stat().st_size > 10_000
    finally:
        service.stop()
