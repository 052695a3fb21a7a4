"""Where step metrics go: stdout, a JSONL file, Prometheus gauges, TensorBoard, wandb
(`tba.wandb_sink`).

Keys are `area/name` (`trainer/loss`, `time/compute_s`); Prometheus names are
`tba_<area>_<name>` (`tba.prometheus`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import prometheus_client

from tba.prometheus import LatestGauges, MetricsServer
from tba.trainer.config import MetricsSettings
from tba.wandb_sink import WandbRun, WandbSink


class MetricsSink(Protocol):
    def write(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class StdoutSink:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def write(self, step: int, values: Mapping[str, float]) -> None:
        shown = " ".join(f"{k}={_short(v)}" for k, v in values.items())
        print(f"step {step} {shown}", file=self.stream, flush=True)

    def close(self) -> None:
        return None


class JsonlSink:
    """One JSON object per step: `step`, `time_s` (Unix time, to plot against wall time) and
    the values."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")
        self._clock = clock

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, "time_s": self._clock(), **values}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class PrometheusSink:
    """Gauges of the latest value of each key, served on `/metrics` from their own registry
    (so several trainers in one test process do not collide)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self._gauges = LatestGauges(self.registry)
        self._step = prometheus_client.Gauge(
            "tba_trainer_step", "Optimizer steps done.", registry=self.registry
        )
        self.server = MetricsServer(self.registry, port, host)
        self.port = self.server.port

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self._step.set(step)
        self._gauges.set(values)

    def close(self) -> None:
        self.server.close()


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer: Any = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class FanOut:
    def __init__(self, sinks: Sequence[MetricsSink]) -> None:
        self.sinks = list(sinks)

    def write(self, step: int, values: Mapping[str, float]) -> None:
        for sink in self.sinks:
            sink.write(step, values)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def build_sinks(
    settings: MetricsSettings, rank: int = 0, wandb_run: WandbRun | None = None
) -> FanOut:
    """The sinks `settings` asks for; ranks other than 0 log nothing. `wandb_run` names the
    wandb run (its group, the training run's id) and holds its config."""
    if rank != 0:
        return FanOut([])
    sinks: list[MetricsSink] = []
    if settings.stdout:
        sinks.append(StdoutSink())
    if settings.jsonl_path:
        sinks.append(JsonlSink(Path(settings.jsonl_path)))
    if settings.prometheus_port is not None:
        sinks.append(PrometheusSink(settings.prometheus_port, settings.prometheus_host))
    if settings.tensorboard_dir:
        sinks.append(TensorBoardSink(Path(settings.tensorboard_dir)))
    if settings.wandb_on:
        sinks.append(WandbSink(settings, wandb_run or WandbRun(job_type="trainer")))
    return FanOut(sinks)


def _short(value: float) -> str:
    return f"{value:.4g}"
