"""A searcher's metrics: each round's `searcher/...` values logged at INFO as one line, and
served to Prometheus from the searcher's own registry: the latest value of every key as a
gauge `tba_searcher_<name>` (tokens/s, prompts/s, mean reward, the diversity of the round's
prompt groups, weight version, lag behind the latest announced version, ...), counters of
rounds and tokens, and summaries of the seconds of each new weight version: reload (from its
announcement to generating with it), swap (the pause between rounds) and fetch (download,
verification and preparation, beside generation); and to wandb when a project is set
(`tba.wandb_sink`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import prometheus_client

from tba.prometheus import LatestGauges, MetricsServer

log = logging.getLogger(__name__)


class RoundSink(Protocol):
    def write(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class SearcherMetrics:
    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", sink: RoundSink | None = None
    ) -> None:
        self._sink = sink
        self.registry = prometheus_client.CollectorRegistry()
        self._gauges = LatestGauges(self.registry)
        self._rounds = prometheus_client.Counter(
            "tba_searcher_rounds", "Rounds done.", registry=self.registry
        )
        self._tokens = prometheus_client.Counter(
            "tba_searcher_completion_tokens", "Completion tokens generated.", registry=self.registry
        )
        self._weight_seconds = {
            key: prometheus_client.Summary(
                f"tba_searcher_{name}_seconds", help_text, registry=self.registry
            )
            for key, name, help_text in (
                (
                    "searcher/reload_s",
                    "reload",
                    "Seconds from seeing a newer weight version to generating with it.",
                ),
                ("searcher/swap_s", "swap", "Seconds generation paused to swap in new weights."),
                (
                    "searcher/fetch_s",
                    "fetch",
                    "Seconds downloading, verifying and preparing new weights, beside generation.",
                ),
            )
        }
        self.server = None if port is None else MetricsServer(self.registry, port, host)
        self.port = None if self.server is None else self.server.port

    def write(self, round_index: int, values: Mapping[str, float]) -> None:
        shown = " ".join(f"{k}={v:.4g}" for k, v in values.items())
        log.info("round %d %s", round_index, shown)
        self._rounds.inc()
        self._tokens.inc(values.get("searcher/tokens", 0.0))
        if values.get("searcher/reloads", 0.0) > 0:
            for key, summary in self._weight_seconds.items():
                summary.observe(values[key])
        self._gauges.set(values)
        if self._sink is not None:
            self._sink.write(round_index, values)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._sink is not None:
            self._sink.close()
