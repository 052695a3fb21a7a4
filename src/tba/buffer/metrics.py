"""Prometheus exposition of the buffer's stats, rendered fresh from one snapshot per scrape,
and of how long the service took over each gRPC call (`HandlingTimes`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tba.domain import BufferStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Upper bounds (s) of the handling-time buckets: a Sample or an add takes milliseconds on an
# idle service, and a queue behind a busy store or event loop shows in the upper ones.
HANDLING_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class HandlingTimes:
    """Seconds the service took over each gRPC call, by method, from the decoded request to
    the reply (`tba_buffer_rpc_handling_seconds`); of a long-polled Sample, the draw it
    answered with (its wait for data and its draws of too few groups left out).
    What a client waits beyond it is the network, gRPC's own queue and (on a shared machine)
    the wait for a core; other calls awaiting the store in the same event loop are inside it."""

    def __init__(self) -> None:
        # Its own registry: the page adds its families to each scrape's snapshot.
        self._histogram = Histogram(
            "tba_buffer_rpc_handling_seconds",
            "Seconds the buffer service took over a gRPC call, by method.",
            ["method"],
            buckets=HANDLING_BUCKETS_S,
            registry=CollectorRegistry(auto_describe=False),
        )

    def observe(self, method: str, seconds: float) -> None:
        self._histogram.labels(method).observe(seconds)

    def families(self) -> Iterator[Metric]:
        yield from self._histogram.collect()


class _SnapshotCollector:
    def __init__(self, stats: BufferStats, handling: HandlingTimes | None) -> None:
        self._stats = stats
        self._handling = handling

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        gauges = {
            "trajectories": ("Trajectories stored.", s.trajectories),
            "prompts": ("Prompts in the pool.", s.prompts),
            "prompts_with_trajectories": (
                "Prompts with stored trajectories.",
                s.prompts_with_trajectories,
            ),
            "leases_in_flight": ("Prompts leased to searchers now.", s.leases_in_flight),
            "reward_mean": ("Mean reward of stored trajectories.", s.reward_mean),
            "latest_version": ("Latest announced weight version.", s.latest_version),
            "adds_per_second": ("Trajectories added per second.", s.adds_per_s),
            "samples_per_second": ("Groups sampled per second.", s.samples_per_s),
            "searchers": ("Searchers seen.", len(s.searchers)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"tba_buffer_{name}", doc, value=value)
        counters = {
            "trajectories_added": ("Trajectories accepted.", s.trajectories_added_total),
            "groups_sampled": ("Prompt groups sampled.", s.groups_sampled_total),
            "evicted": ("Trajectories evicted by the bounds.", s.evicted_total),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"tba_buffer_{name}", doc, value=value)
        yield from self._labelled()
        if self._handling is not None:
            yield from self._handling.families()

    def _labelled(self) -> Iterator[Metric]:
        s = self._stats
        by_age = GaugeMetricFamily(
            "tba_buffer_trajectories_by_staleness",
            "Stored trajectories by age in versions behind the latest.",
            labels=["versions_behind"],
        )
        for age, count in s.staleness().items():
            by_age.add_metric([str(age)], count)
        yield by_age
        histogram = GaugeMetricFamily(
            "tba_buffer_reward_bin",
            "Stored trajectories per reward bin [low, high).",
            labels=["low", "high"],
        )
        edges = s.reward_histogram_edges
        for low, high, count in zip(edges, edges[1:], s.reward_histogram_counts, strict=False):
            histogram.add_metric([f"{low:g}", f"{high:g}"], count)
        yield histogram
        run = GaugeMetricFamily(
            "tba_buffer_run_info",
            "1 for the registered run (none while no trainer has registered one).",
            labels=["run_id", "task", "model_source", "model_revision"],
        )
        if s.run is not None:
            i = s.run.identity
            run.add_metric([s.run.run_id, i.task_name, i.model_source, i.model_revision], 1)
        yield run


def render(stats: BufferStats, handling: HandlingTimes | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(stats, handling))
    return generate_latest(registry)
