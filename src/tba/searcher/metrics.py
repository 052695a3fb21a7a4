"""A searcher's metrics: each round's `searcher/...` values logged at INFO as one line, and
served to Prometheus from the searcher's own registry: the latest value of every key as a
gauge `tba_searcher_<name>` (tokens/s, prompts/s, mean reward, weight version, lag behind
the latest announced version, ...), counters of rounds and tokens, and a summary of reload
seconds."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import prometheus_client

log = logging.getLogger(__name__)


def prometheus_name(key: str) -> str:
    return "tba_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class SearcherMetrics:
    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self._gauges: dict[str, prometheus_client.Gauge] = {}
        self._rounds = prometheus_client.Counter(
            "tba_searcher_rounds", "Rounds done.", registry=self.registry
        )
        self._tokens = prometheus_client.Counter(
            "tba_searcher_completion_tokens", "Completion tokens generated.", registry=self.registry
        )
        self._reload_s = prometheus_client.Summary(
            "tba_searcher_reload_seconds",
            "Seconds from seeing a newer weight version to generating with it.",
            registry=self.registry,
        )
        self.server = None
        self.port: int | None = None
        if port is not None:
            self.server, _ = prometheus_client.start_http_server(
                port, addr=host, registry=self.registry
            )
            self.port = int(self.server.server_address[1])

    def write(self, round_index: int, values: Mapping[str, float]) -> None:
        shown = " ".join(f"{k}={v:.4g}" for k, v in values.items())
        log.info("round %d %s", round_index, shown)
        self._rounds.inc()
        self._tokens.inc(values.get("searcher/tokens", 0.0))
        if values.get("searcher/reloads", 0.0) > 0:
            self._reload_s.observe(values["searcher/reload_s"])
        for key, value in values.items():
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = prometheus_client.Gauge(prometheus_name(key), key, registry=self.registry)
                self._gauges[key] = gauge
            gauge.set(value)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
