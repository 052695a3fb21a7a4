"""One `tba local` run: base model, services, live evaluation and progress, report."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tba.local import children
from tba.local.config import LocalRunSettings
from tba.local.evaluator import EvaluationPoster, Evaluator, GreedyAccuracy, VersionWatcher
from tba.local.progress import ProgressView
from tba.local.report import JsonlTail, plot, read_jsonl, summarize
from tba.local.supervisor import Child, Supervisor
from tba.local.tiny_models import TINY, tiny_policy, with_tiny_task_models
from tba.tasks.base import Split, Task
from tba.tasks.registry import build_task

log = logging.getLogger(__name__)
BUFFER_READY = r"buffer service ready: grpc ([\d.]+:\d+), http (http://[\d.:]+)"
SEARCHER_READY = r"searcher ready"
# What a new run replaces; cached base models (base-*) stay.
RUN_OUTPUTS = (
    "weights",
    "checkpoints",
    "metrics",
    "logs",
    "eval",
    "eval.jsonl",
    "plot.png",
    "summary.json",
    "tiny",
)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class ServiceFailedError(RuntimeError):
    """A child service exited with an error; its log names the cause."""


class LocalRun:
    def __init__(self, settings: LocalRunSettings) -> None:
        self.settings = settings
        self.run_dir = Path(settings.local.run_dir)
        children.apply_mode(settings)

    def run(self) -> None:
        import torch
        from transformers.utils import logging as transformers_logging

        from tba.models.loading import quiet_progress_bars

        torch.set_num_threads(self.settings.local.threads_per_process)
        # Every evaluation loads a version: its progress bar and warnings would bury the log.
        quiet_progress_bars()
        transformers_logging.set_verbosity_error()
        self._clear_previous_outputs()
        with_tiny_task_models(self.settings.task, self.run_dir / "tiny")
        task = build_task(self.settings.task)
        base = self._base_model(task)
        evaluator = self._evaluator(task, base)
        supervisor = Supervisor(self.run_dir / "logs")
        started_at_s = time.time()
        # `kill`, a container stop, and SIGINT to a run that a non-interactive shell started in
        # the background (which leaves SIGINT ignored: Python then keeps it ignored) stop the
        # run as Ctrl-C does: services in order, then the report.
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        try:
            self._serve(supervisor, base, evaluator, started_at_s)
        except KeyboardInterrupt:
            print("interrupted")
        finally:
            # A stop signal that arrives now (a second Ctrl-C, or a caller's SIGTERM racing
            # the run's own stop at its target) would abandon the orderly stop half-way.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print("stopping every service", flush=True)
            supervisor.stop_all()
        self._report(evaluator, time.time() - started_at_s, started_at_s)

    def _serve(
        self, supervisor: Supervisor, base: Path, evaluator: Evaluator, started_at_s: float
    ) -> None:
        """Starts the services and follows the run until the trainer finishes."""
        from tba.objectstore import open_object_store

        address, http_url = self._start_buffer(supervisor)
        token = self.settings.buffer.auth_token
        evaluator.follow(
            EvaluationPoster(http_url, token.get_secret_value() if token is not None else None)
        )
        trainer = self._start_trainer_and_searchers(supervisor, base, address)
        os.nice(self.settings.local.evaluator_niceness)
        watcher = VersionWatcher(
            open_object_store(self.settings.objectstore),
            evaluator,
            self.run_dir / "eval",
            started_at_s,
        )
        self._follow(supervisor, trainer, watcher, evaluator)

    def _follow(
        self, supervisor: Supervisor, trainer: Child, watcher: VersionWatcher, evaluator: Evaluator
    ) -> None:
        """Evaluates new versions and shows progress until the trainer finishes or the target
        accuracy is reached."""
        trainer_log = JsonlTail(self.run_dir / "metrics" / "trainer.jsonl")
        last_row: list[dict[str, Any]] = []
        with ProgressView(self.settings.trainer.steps, self.settings.local.progress) as view:
            last_eval_s = 0.0
            while trainer.proc.poll() is None and not self._target_reached(evaluator):
                self._check_children(supervisor)
                if time.monotonic() - last_eval_s >= self.settings.local.eval_interval_s:
                    last_eval_s = time.monotonic()
                    watcher.poll()
                last_row = trainer_log.read_new()[-1:] or last_row
                view.update(last_row, evaluator.points)
                time.sleep(0.5)
            self._check_children(supervisor)
            watcher.poll()
            last_row = trainer_log.read_new()[-1:] or last_row
            view.update(last_row, evaluator.points)

    def _target_reached(self, evaluator: Evaluator) -> bool:
        target = self.settings.local.stop_at_accuracy
        reached = target > 0 and any(p.accuracy >= target for p in evaluator.points)
        if reached:
            print(f"held-out accuracy reached {target}")
        return reached

    def _start_buffer(self, supervisor: Supervisor) -> tuple[str, str]:
        """Starts the buffer; its gRPC address and REST root."""
        config = children.buffer_config(self.settings, self.run_dir)
        buffer = self._start_service(
            supervisor, "buffer", ["buffer", "serve", "--config", str(config)]
        )
        ready = self._wait_ready(supervisor, buffer, BUFFER_READY)
        address, http_url = ready.group(1), ready.group(2)
        print(f"dashboard: {http_url}/   stats: {http_url}/v1/stats   logs: {supervisor.log_dir}")
        return address, http_url

    def _start_trainer_and_searchers(
        self, supervisor: Supervisor, base: Path, address: str
    ) -> Child:
        env = {
            **children.secret_env(self.settings),
            "OMP_NUM_THREADS": str(self.settings.local.threads_per_process),
        }
        searchers = []
        for index in range(self.settings.local.searchers):
            config = children.searcher_config(self.settings, self.run_dir, base, address, index)
            args = ["searcher", "run", "--config", str(config)]
            searchers.append(self._start_service(supervisor, f"searcher-{index}", args, env))
        config = children.trainer_config(self.settings, self.run_dir, base, address)
        args = ["trainer", "run", "--config", str(config)]
        trainer = self._start_service(supervisor, "trainer", args, env)
        for searcher in searchers:
            self._wait_ready(supervisor, searcher, SEARCHER_READY)
        return trainer

    def _start_service(
        self, supervisor: Supervisor, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> Child:
        """`tba ARGS` as the child `name`: forked from this process or a new program
        (`local.start_method`)."""
        if children.forks(self.settings):
            from tba.cli import main

            return supervisor.fork(name, lambda: main(args), env)
        return supervisor.start(name, children.command(*args), env)

    def _wait_ready(self, supervisor: Supervisor, child: Child, pattern: str) -> re.Match[str]:
        try:
            return child.wait_for_line(pattern, self.settings.local.start_timeout_s)
        except RuntimeError as exc:
            raise ServiceFailedError(f"{exc}:\n{_tail(child.log_path)}") from exc

    @staticmethod
    def _check_children(supervisor: Supervisor) -> None:
        failed = supervisor.failed()
        if failed is not None:
            raise ServiceFailedError(
                f"{failed.name} exited with code {failed.proc.returncode}; its log "
                f"({failed.log_path}) ends:\n{_tail(failed.log_path)}"
            )

    def _base_model(self, task: Task) -> Path:
        local = self.settings.local
        if local.model:
            return Path(local.model)
        source = self.settings.model.source
        if source != TINY:
            return Path(source)
        if task.name != "arithmetic":
            # Trainer, searchers and evaluator must start from the same weights: one saved copy.
            seed = self.settings.trainer.seed
            return tiny_policy(self.settings.model, self.run_dir / "tiny" / "policy", seed)
        if local.base == "committed":
            if self.settings.bootstrap.model_fields_set:
                raise SystemExit(
                    'error: [bootstrap] settings apply only with local.base = "bootstrap"'
                )
            from tba.local.bases import DEMO_BASE, verified_base

            return verified_base(DEMO_BASE)
        from tba.local.bootstrap import bootstrap_base_model

        print("pre-training the tiny base model (cached for later runs)...", flush=True)
        return bootstrap_base_model(self.run_dir, self.settings.bootstrap, task)

    def _evaluator(self, task: Task, base: Path) -> Evaluator:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        prompts = task.prompts(Split.TEST)[: self.settings.local.eval_prompts]
        tokenizer = AutoTokenizer.from_pretrained(base)
        accuracy = GreedyAccuracy(task, prompts, tokenizer, self.settings.searcher.max_new_tokens)
        evaluator = Evaluator(accuracy, self.run_dir / "eval.jsonl")
        point = evaluator.record(AutoModelForCausalLM.from_pretrained(base), 0.0, 0, 0)
        print(
            f"base model held-out accuracy: {point.accuracy:.3f} on {len(prompts)} prompts",
            flush=True,
        )
        return evaluator

    def _clear_previous_outputs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in RUN_OUTPUTS:
            path = self.run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        for folder in self.run_dir.glob("searcher-*"):
            shutil.rmtree(folder)

    def _report(self, evaluator: Evaluator, wall_s: float, started_at_s: float) -> None:
        from tba.local.report import print_summary

        # Read once every service has stopped: a run stopped by a signal (Ctrl-C, or a caller
        # stopping it at its target) counts the steps its trainer did to the end.
        trainer_rows = read_jsonl(self.run_dir / "metrics" / "trainer.jsonl")
        steps = int(trainer_rows[-1]["step"]) if trainer_rows else 0
        summary = summarize(self.settings.local.mode, evaluator.points, steps, wall_s)
        plot(evaluator.points, trainer_rows, started_at_s, self.run_dir / "plot.png")
        print_summary(summary, self.run_dir)


def _tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
