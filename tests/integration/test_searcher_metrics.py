import logging
import urllib.request

from tba.searcher.metrics import SearcherMetrics


def test_round_values_are_logged_and_served_to_prometheus(caplog):
    metrics = SearcherMetrics(port=0)
    try:
        assert metrics.port
        with caplog.at_level(logging.INFO, logger="tba.searcher.metrics"):
            metrics.write(1, {"searcher/tokens": 40.0, "searcher/tokens_per_s": 20.0})
            metrics.write(
                2,
                {
                    "searcher/tokens": 60.0,
                    "searcher/tokens_per_s": 30.0,
                    "searcher/reloads": 1.0,
                    "searcher/reload_s": 0.25,
                    "searcher/swap_s": 0.0625,
                    "searcher/fetch_s": 0.125,
                    "searcher/version": 3.0,
                },
            )
        url = f"http://127.0.0.1:{metrics.port}/metrics"
        with urllib.request.urlopen(url) as response:
            text = response.read().decode()
    finally:
        metrics.close()
    assert "round 2 searcher/tokens=60 searcher/tokens_per_s=30" in caplog.text
    lines = set(text.splitlines())
    assert "tba_searcher_tokens_per_s 30.0" in lines
    assert "tba_searcher_version 3.0" in lines
    assert "tba_searcher_rounds_total 2.0" in lines
    assert "tba_searcher_completion_tokens_total 100.0" in lines
    assert "tba_searcher_reload_seconds_count 1.0" in lines
    assert "tba_searcher_reload_seconds_sum 0.25" in lines
    assert "tba_searcher_swap_seconds_sum 0.0625" in lines
    assert "tba_searcher_fetch_seconds_sum 0.125" in lines
    assert "tba_searcher_swap_s 0.0625" in lines
