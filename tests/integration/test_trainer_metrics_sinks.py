"""The Prometheus and TensorBoard sinks against the real things: an HTTP scrape of /metrics
and TensorBoard's own event reader."""

import urllib.request

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tba.trainer.config import MetricsSettings
from tba.trainer.metrics import PrometheusSink, TensorBoardSink, build_sinks


def test_prometheus_sink_serves_the_latest_values():
    sink = PrometheusSink(port=0)
    try:
        sink.write(3, {"trainer/loss": 0.5, "time/wait_data_s": 1.25})
        sink.write(4, {"trainer/loss": 0.25, "time/wait_data_s": 0.0})
        url = f"http://127.0.0.1:{sink.port}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        sink.close()
    assert "tba_trainer_step 4.0" in body
    assert "tba_trainer_loss 0.25" in body
    assert "tba_time_wait_data_s 0.0" in body


def test_tensorboard_sink_writes_scalars_tensorboard_reads(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.write(1, {"trainer/loss": 2.0})
    sink.write(2, {"trainer/loss": 1.5})
    sink.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    scalars = events.Scalars("trainer/loss")
    assert [(e.step, e.value) for e in scalars] == [(1, 2.0), (2, pytest.approx(1.5))]


def test_only_rank_zero_logs(tmp_path):
    settings = MetricsSettings(jsonl_path=str(tmp_path / "m.jsonl"))
    assert build_sinks(settings, rank=1).sinks == []
    sinks = build_sinks(settings, rank=0)
    assert len(sinks.sinks) == 2  # stdout and JSONL
    sinks.close()
