"""The Prometheus names of metric keys and the gauges that hold their latest values."""

import prometheus_client

from tba.prometheus import LatestGauges, prometheus_name


def test_prometheus_names():
    assert prometheus_name("trainer/grad_norm") == "tba_trainer_grad_norm"
    assert prometheus_name("time/wait_data_s") == "tba_time_wait_data_s"
    assert prometheus_name("searcher/tokens-per.s") == "tba_searcher_tokens_per_s"


def test_a_gauge_per_key_holds_its_latest_value():
    registry = prometheus_client.CollectorRegistry()
    gauges = LatestGauges(registry)
    gauges.set({"trainer/loss": 0.5, "time/wait_data_s": 1.25})
    gauges.set({"trainer/loss": 0.25})
    assert registry.get_sample_value("tba_trainer_loss") == 0.25
    assert registry.get_sample_value("tba_time_wait_data_s") == 1.25
