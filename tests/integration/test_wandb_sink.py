"""wandb as a metrics sink, in wandb's offline mode (never a network): what the trainer and a
searcher log is read back from the run files wandb writes (tests.fixtures.wandb_files), and a
process without a project never imports wandb."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tba.buffer.transport.grpc_client import BufferClient
from tba.searcher.main import build_searcher
from tba.searcher.metrics import SearcherMetrics
from tba.trainer.config import MetricsSettings
from tba.trainer.metrics import build_sinks
from tba.wandb_sink import WandbRun, WandbSink
from tests.fixtures.wandb_files import offline_runs
from tests.integration.test_searcher_service import RUN, SEARCHER_ID, run_settings
from tests.integration.test_trainer_service import add_searcher_round, run_trainer

OFFLINE = {"wandb_project": "tba-test", "wandb_mode": "offline"}


@pytest.fixture(autouse=True)
def quiet_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_trainer_sinks_log_each_step_with_the_runs_name_group_and_config(tmp_path):
    settings = MetricsSettings(stdout=False, wandb_dir=str(tmp_path), **OFFLINE)
    config = {"trainer": {"steps": 2}}
    sinks = build_sinks(settings, rank=0, wandb_run=WandbRun("run-1", "trainer", "run-1/t", config))
    assert [type(s) for s in sinks.sinks] == [WandbSink]
    sinks.write(1, {"trainer/loss": 2.0, "trainer/kl": 0.5})
    sinks.write(2, {"trainer/loss": 1.5, "trainer/kl": 0.25})
    sinks.close()
    [run] = offline_runs(tmp_path)
    assert (run.project, run.name, run.group, run.job_type) == (
        "tba-test",
        "run-1/t",
        "run-1",
        "trainer",
    )
    assert run.config["trainer"] == {"steps": 2}
    assert run.history == {
        1: {"trainer/loss": 2.0, "trainer/kl": 0.5},
        2: {"trainer/loss": 1.5, "trainer/kl": 0.25},
    }


def test_searcher_metrics_forward_each_round(tmp_path):
    settings = MetricsSettings(wandb_dir=str(tmp_path), **OFFLINE)
    sink = WandbSink(settings, WandbRun("run-1", "searcher", "run-1/s-0"))
    metrics = SearcherMetrics(sink=sink)
    metrics.write(1, {"searcher/tokens": 40.0, "searcher/reward_mean": 0.25})
    metrics.close()
    [run] = offline_runs(tmp_path)
    assert run.history == {1: {"searcher/tokens": 40.0, "searcher/reward_mean": 0.25}}


def test_tba_trainer_run_logs_to_wandb_set_by_environment(
    client: BufferClient, buffer_address, tmp_path, monkeypatch
):
    monkeypatch.setenv("TBA_METRICS__WANDB_PROJECT", "tba-test")
    monkeypatch.setenv("TBA_METRICS__WANDB_MODE", "offline")
    monkeypatch.setenv("TBA_METRICS__WANDB_DIR", str(tmp_path / "wandb-files"))
    # A buffer without a token of its own takes calls that carry one.
    monkeypatch.setenv("TBA_CLIENT__AUTH_TOKEN", "never-in-the-config-0123")
    add_searcher_round(client)
    run_trainer(buffer_address, tmp_path, steps=2)
    run_id = (tmp_path / "ckpt" / "RUN").read_text().strip()
    [run] = offline_runs(tmp_path / "wandb-files")
    assert (run.name, run.group, run.job_type) == (f"{run_id}/trainer", run_id, "trainer")
    assert run.config["trainer"]["steps"] == 2
    assert run.config["metrics"]["wandb_project"] == "tba-test"
    assert "auth_token" not in run.config["client"]
    assert sorted(run.history) == [1, 2]
    for values in run.history.values():
        assert {"trainer/loss", "trainer/kl", "trainer/log_z", "time/wait_data_s"} <= set(values)


def test_a_searcher_logs_its_rounds_in_the_runs_group(
    client: BufferClient, buffer_address, tmp_path
):
    client.register_run(RUN)
    wandb_dir = tmp_path / "wandb-files"
    settings = run_settings(
        buffer_address, tmp_path, max_rounds=1, wandb_dir=str(wandb_dir), **OFFLINE
    )
    searcher = build_searcher(settings)
    assert searcher is not None
    try:
        assert searcher.loop.run() == 1
    finally:
        searcher.close()
    [run] = offline_runs(wandb_dir)
    assert (run.name, run.group, run.job_type) == (
        f"{RUN.run_id}/{SEARCHER_ID}",
        RUN.run_id,
        "searcher",
    )
    assert run.config["task"]["name"] == "arithmetic"
    assert run.config["searcher"]["max_new_tokens"] == RUN.identity.max_new_tokens
    [values] = run.history.values()
    assert {"searcher/tokens", "searcher/reward_mean", "searcher/version"} <= set(values)


def test_without_a_project_nothing_imports_wandb():
    check = (
        "import sys\n"
        "import tba.searcher.main, tba.trainer.main\n"
        "from tba.trainer.config import MetricsSettings\n"
        "from tba.trainer.metrics import build_sinks\n"
        "build_sinks(MetricsSettings(stdout=False, wandb_mode='offline')).close()\n"
        "print('wandb' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.fixture
def client(buffer_address):
    from tba.buffer.config import BufferClientSettings

    with BufferClient(BufferClientSettings(address=buffer_address, retries=2)) as c:
        yield c
