"""The Grafana board (deploy/grafana/tba.json) against the services' real /metrics: the JSON
loads, every panel has a query, and every metric and label the queries name is in what the
services serve: a real buffer service holding a searcher's round, a real searcher after that
round (its own /metrics server), and the trainer's Prometheus sink fed the real step metrics
of one step."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.searcher.main import build_searcher
from tba.trainer.metrics import PrometheusSink
from tba.trainer.step import Gradients, StepResult, step_metrics
from tests.fixtures.buffer_service import BufferProcess
from tests.integration.test_searcher_service import RUN, run_settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/tba.json"
METRIC = re.compile(r"\btba_[a-zA-Z0-9_]+")
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queried(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in panels(board) if p["type"] != "row" for t in p.get("targets", [])]


def exposed(text: str) -> dict[str, set[str]]:
    """Metric name -> its label names, from a Prometheus text exposition."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = re.findall(r'([a-zA-Z_]\w*)="', match.group(2) or "")
            found.setdefault(match.group(1), set()).update(labels)
    return found


def scrape(url: str) -> dict[str, set[str]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return exposed(response.read().decode())


def one_step_of_the_trainer() -> dict[str, set[str]]:
    gradients = Gradients(
        loss=0.5,
        baseline_mean=1.0,
        policy_logprob=-3.0,
        kl=0.01,
        kl_token_mean=0.002,
        micro_batches=2,
        prepass=False,
    )
    result = StepResult(gradients, 0.9, 1e-5, 0.5, 12, 3, 1.0, 2.0, 2)
    sink = PrometheusSink(port=0)
    try:
        sink.write(1, step_metrics(result, beta=0.1, version=2, times=(0.5, 1.0, 0.25, 0.0)))
        return scrape(f"http://127.0.0.1:{sink.port}/metrics")
    finally:
        sink.close()


@pytest.fixture
def served(buffer_service: BufferProcess, tmp_path: Path) -> dict[str, set[str]]:
    """Every metric the three services serve after a searcher's round and a trainer step."""
    with BufferClient(BufferClientSettings(address=buffer_service.address)) as client:
        client.register_run(RUN)
    searcher = build_searcher(
        run_settings(buffer_service.address, tmp_path, max_rounds=1, metrics_port=0)
    )
    assert searcher is not None
    try:
        assert searcher.loop.run() == 1
        found = scrape(f"http://127.0.0.1:{searcher.metrics.port}/metrics")
    finally:
        searcher.close()
    for name, labels in [
        *scrape(f"{buffer_service.http_url}/metrics").items(),
        *one_step_of_the_trainer().items(),
    ]:
        found.setdefault(name, set()).update(labels)
    return found


def test_the_board_loads_and_every_panel_has_a_query() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(board):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel.get("targets"), f"{panel['title']}: no query"
            for target in panel["targets"]:
                assert METRIC.search(target["expr"]), f"{panel['title']}: {target['expr']}"
    names = {"datasource"}
    assert {v["name"] for v in board["templating"]["list"]} == names


def test_every_metric_and_label_the_board_queries_is_served(served) -> None:
    board = json.loads(DASHBOARD.read_text())
    missing, unlabelled = set(), set()
    for target in queried(board):
        metrics = set(METRIC.findall(target["expr"]))
        missing |= metrics - set(served)
        named = set(re.findall(r"\{\{(\w+)\}\}", target["legendFormat"]))
        named |= {
            n.strip() for by in re.findall(r"by \(([^)]*)\)", target["expr"]) for n in by.split(",")
        }
        have = set().union(*(served.get(m, set()) for m in metrics)) | TARGET_LABELS
        unlabelled |= {f"{target['expr']}: {label}" for label in named - have}
    assert not missing, f"queried but never served: {sorted(missing)}"
    assert not unlabelled, f"labels no queried metric has: {sorted(unlabelled)}"
    # What the issue asks the board to show, by the service that serves it.
    shown = {m for t in queried(board) for m in METRIC.findall(t["expr"])}
    for expected in (
        "tba_buffer_reward_mean",
        "tba_buffer_adds_per_second",
        "tba_buffer_samples_per_second",
        "tba_buffer_trajectories_by_staleness",
        "tba_buffer_rpc_handling_seconds_bucket",
        "tba_trainer_loss",
        "tba_trainer_kl",
        "tba_trainer_kl_token_mean",
        "tba_trainer_log_z",
        "tba_trainer_lr",
        "tba_trainer_grad_norm",
        "tba_time_wait_data_s",
        "tba_searcher_tokens_per_s",
        "tba_searcher_generate_s",
        "tba_searcher_version",
        "tba_searcher_swap_seconds_sum",
        "tba_searcher_fetch_seconds_sum",
        "tba_searcher_distinct_answer_ratio",
        "tba_searcher_pairwise_distance",
    ):
        assert expected in shown, expected
