"""Held-out accuracy of each weight version as it is published: greedy completions of the
task's test prompts, scored by the task's reward. Runs in the `tba local` process."""

from __future__ import annotations

import json
import logging
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tba.domain import Prompt
from tba.models.generate import generate_texts
from tba.objectstore import ObjectStore
from tba.objectstore.weights import fetch_weights, read_latest
from tba.tasks.base import Task
from tba.tasks.evaluate import evaluate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalPoint:
    wall_s: float  # since the services started
    version: int
    step: int
    accuracy: float


class GreedyAccuracy:
    """The task's mean reward of greedy completions of `prompts`, all in one batch."""

    def __init__(self, task: Task, prompts: list[Prompt], tokenizer: Any, max_new_tokens: int):
        self.task = task
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens

    def __call__(self, model: Any) -> float:
        model.eval()
        result = evaluate(
            self.task,
            self.prompts,
            lambda batch: self._greedy([p.text for p in batch], model),
        )
        return result.accuracy

    def _greedy(self, texts: list[str], model: Any) -> list[str]:
        groups = generate_texts(
            model, self.tokenizer, texts, self.max_new_tokens, batch_size=len(texts)
        )
        return [group[0].text for group in groups]


class EvaluationPoster:
    """Posts each point to the buffer's history (`POST /v1/evaluations`, with the buffer's
    token when it has one), so its dashboard draws held-out accuracy next to the run. A
    buffer that cannot take it costs that point on the dashboard, never the run."""

    def __init__(self, http_url: str, token: str | None, timeout_s: float = 5.0) -> None:
        self.url = f"{http_url}/v1/evaluations"
        self.headers = {"content-type": "application/json"}
        if token is not None:
            self.headers["authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s

    def __call__(self, point: EvalPoint) -> None:
        metrics = {"accuracy": point.accuracy}
        body = {"version": point.version, "step": point.step, "metrics": metrics}
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=self.headers, method="POST"
        )
        try:
            urllib.request.urlopen(request, timeout=self.timeout_s).close()
        except (urllib.error.URLError, OSError) as exc:
            log.warning("version %d's accuracy not posted to the buffer: %s", point.version, exc)


class Evaluator:
    def __init__(self, accuracy: GreedyAccuracy, log_path: Path) -> None:
        self.accuracy = accuracy
        self.log_path = log_path
        self.points: list[EvalPoint] = []
        self._listeners: list[Callable[[EvalPoint], None]] = []

    def follow(self, listener: Callable[[EvalPoint], None]) -> None:
        """Hands `listener` every point so far, then each new one."""
        for point in self.points:
            listener(point)
        self._listeners.append(listener)

    def record(self, model: Any, wall_s: float, version: int, step: int) -> EvalPoint:
        point = EvalPoint(wall_s, version, step, self.accuracy(model))
        self.points.append(point)
        with self.log_path.open("a") as out:
            out.write(json.dumps(asdict(point)) + "\n")
        for listener in self._listeners:
            listener(point)
        return point


class VersionWatcher:
    """Evaluates the newest published version when one appears (skipping those a slow
    evaluation missed); ignores versions published before this run started."""

    def __init__(
        self, store: ObjectStore, evaluator: Evaluator, cache_dir: Path, started_at_s: float
    ) -> None:
        self.store = store
        self.evaluator = evaluator
        self.cache_dir = cache_dir
        self.started_at_s = started_at_s
        self.seen_version = 0

    def poll(self) -> EvalPoint | None:
        from transformers import AutoModelForCausalLM

        latest = read_latest(self.store)
        if latest is None or latest.version <= self.seen_version:
            return None
        if latest.published_at_s < self.started_at_s:
            return None
        self.seen_version = latest.version
        folder = fetch_weights(self.store, latest, self.cache_dir / f"v{latest.version}")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        shutil.rmtree(folder, ignore_errors=True)
        wall_s = latest.published_at_s - self.started_at_s
        point = self.evaluator.record(model, wall_s, latest.version, latest.step)
        log.info("version %d (step %d): accuracy %.3f", point.version, point.step, point.accuracy)
        return point
