"""Metric values keyed `area/name` (`trainer/loss`, `searcher/tokens_per_s`) served to
Prometheus by the trainer and the searcher: one name rule, a gauge per key holding its latest
value, and the `/metrics` server. Each owner keeps its own registry, so several trainers or
searchers in one test process do not collide."""

from __future__ import annotations

import re
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

import prometheus_client


def prometheus_name(key: str) -> str:
    """`trainer/grad_norm` -> `tba_trainer_grad_norm`: what Prometheus refuses becomes `_`."""
    return "tba_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class LatestGauges:
    """A gauge per key, made the first time the key is written (its help text is the key)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.registry = registry
        self._gauges: dict[str, prometheus_client.Gauge] = {}

    def set(self, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = prometheus_client.Gauge(prometheus_name(key), key, registry=self.registry)
                self._gauges[key] = gauge
            gauge.set(value)


class MetricsServer:
    """`/metrics` of `registry` on `host`:`port` (0: a free port, then read `port`)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry, port: int, host: str) -> None:
        self._server: WSGIServer
        self._server, _ = prometheus_client.start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
