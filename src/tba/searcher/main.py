"""`tba searcher run`: leases prompts from the buffer, generates and scores completions with
the latest published weights, and adds them to the buffer. Stateless: run as many as you like,
start and stop them at any time (SIGTERM finishes the round in progress, then exits)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tba.cli import Flag
from tba.errors import FailedPreconditionError
from tba.heap import freeze_startup_objects
from tba.searcher.config import SearcherRunSettings
from tba.settings import CommandSettings
from tba.signals import stop_on_signals

if TYPE_CHECKING:
    from tba.buffer.transport.grpc_client import BufferClient
    from tba.runs import Run
    from tba.searcher.engine import GenerationEngine
    from tba.searcher.loop import SearcherLoop
    from tba.searcher.metrics import SearcherMetrics
    from tba.searcher.reference import ReferenceScorer
    from tba.searcher.weights import WeightSync
    from tba.tasks.base import Task
    from tba.wandb_sink import WandbSink

HELP = "Generate and score completions of the buffer's prompts with the latest weights."
log = logging.getLogger(__name__)
SEED_CHUNK_PROMPTS = 1000


SETTINGS = SearcherRunSettings
# Shown in `--help` as the example of `--set`.
SET_EXAMPLE = "searcher.temperature=0.7"
FLAGS = (
    Flag(
        "--buffer",
        "client.address",
        "host:port of the buffer service's gRPC server",
        metavar="HOST:PORT",
    ),
    Flag(
        "--model",
        "model.source",
        "`tiny`, or a model directory / hub name (the base model)",
        metavar="MODEL",
    ),
    Flag(
        "--store",
        "objectstore.uri",
        "where weights are published: file://PATH or s3://...",
        metavar="URI",
    ),
    Flag("--engine", "engine.kind", "`transformers` (default) or `vllm`", metavar="ENGINE"),
    Flag(
        "--task",
        "task.name",
        "task whose prompts are seeded and whose reward scores",
        metavar="TASK",
    ),
    Flag(
        "--rounds",
        "searcher.max_rounds",
        "stop after this many rounds (0: run until stopped)",
        metavar="N",
    ),
)


@dataclass
class Searcher:
    """A wired searcher and what it must release."""

    loop: SearcherLoop
    client: BufferClient
    engine: GenerationEngine
    weights: WeightSync
    metrics: SearcherMetrics
    settings: SearcherRunSettings
    run: Run

    def close(self) -> None:
        self.metrics.close()
        # The fetcher thread prepares weights for the engine: it stops first.
        self.weights.close()
        self.engine.close()
        self.client.close()


def run(settings: CommandSettings) -> None:
    assert isinstance(settings, SearcherRunSettings)
    import torch

    from tba.models.loading import import_model_code, quiet_progress_bars

    torch.manual_seed(settings.searcher.seed)
    quiet_progress_bars()
    # Before the wait for a run: the trainer registers one only once it has started, which
    # takes longer than these imports and the collection before freezing what they made, so
    # neither delays this searcher's first round.
    import_model_code()
    freeze_startup_objects()
    # SIGTERM and Ctrl-C end the wait for a run, or let the round in progress finish (its
    # trajectories posted, its lease acknowledged); then the process exits 0.
    with stop_on_signals("stopping after the round in progress") as stop:
        try:
            searcher = build_searcher(settings, stop)
        except FailedPreconditionError as exc:
            raise SystemExit(f"searcher refused by the buffer: {exc}") from exc
        if searcher is None:
            log.info("searcher stopped before a run was registered")
            return
        try:
            searcher.weights.catch_up()
            s = searcher.settings
            print(
                f"searcher ready: id {searcher.loop.searcher_id}, engine {s.engine.kind}, "
                f"version {searcher.engine.version}, task {s.task.name}, "
                f"buffer {s.client.address}, run {searcher.run.run_id}",
                flush=True,
            )
            rounds = searcher.loop.run()
            log.info("searcher done: %d rounds, weight version %d", rounds, searcher.engine.version)
        finally:
            searcher.close()


def build_searcher(
    settings: SearcherRunSettings, stop: threading.Event | None = None
) -> Searcher | None:
    """Joins the buffer's run (waiting until one is registered; None when `stop` is set
    first) and wires the real collaborators: task, engine, reference, weights. A setting
    that contradicts the run is FailedPreconditionError naming the field."""
    from tba.buffer.transport.grpc_client import BufferClient
    from tba.searcher.joining import adopt_run, settings_identity, wait_for_run

    stop = stop or threading.Event()
    searcher_id = settings.searcher.id or default_searcher_id()
    client = BufferClient(settings.client)
    try:
        client.wait_ready(settings.client.timeout_s)
        run = wait_for_run(client, searcher_id, settings.searcher.idle_poll_s, stop)
        if run is None:
            client.close()
            return None
        settings = adopt_run(settings, run)
        client.join_run(searcher_id, settings_identity(settings))
        return _wire(settings, client, run, searcher_id, stop)
    except BaseException:
        client.close()
        raise


def _wire(
    settings: SearcherRunSettings,
    client: BufferClient,
    run: Run,
    searcher_id: str,
    stop: threading.Event,
) -> Searcher:
    from tba.models.loading import load_model
    from tba.searcher.joining import RunBuffer, model_identity
    from tba.searcher.loop import SearcherLoop
    from tba.searcher.metrics import SearcherMetrics
    from tba.searcher.settled import SettledPrompts
    from tba.tasks.registry import build_task

    s = settings.searcher
    base_seed = run.recipe.model_seed
    task = build_task(settings.task)
    # The reference is the base model, loaded once; the engine holds its own copy and
    # hot-reloads that one.
    tokenizer, base = load_model(settings.model, base_seed)
    client.join_run(searcher_id, model_identity(settings, tokenizer, base.config, base_seed))
    log.info("joined run %s: task %s, model %s", run.run_id, task.name, settings.model.source)
    if s.seed_prompts:
        log.info("seeded %d new prompts of %s", seed_prompts(client, task), task.name)
    engine = build_engine(settings, base_seed)
    metrics = SearcherMetrics(
        s.metrics_port, s.metrics_host, wandb_sink(settings, run, searcher_id)
    )
    weights = build_weight_sync(settings, client, engine)
    loop = SearcherLoop(
        settings=s,
        searcher_id=searcher_id,
        buffer=RunBuffer(client, run.run_id),
        engine=engine,
        tokenizer=tokenizer,
        task=task,
        reference=build_reference(settings, tokenizer, base),
        weights=weights,
        metrics=metrics,
        settled=SettledPrompts(s.settled_prompt_passes) if s.settled_prompt_passes else None,
        stop=stop,
    )
    return Searcher(loop, client, engine, weights, metrics, settings, run)


def wandb_sink(settings: SearcherRunSettings, run: Run, searcher_id: str) -> WandbSink | None:
    """The searcher's wandb run when `[searcher] wandb_project` is set: `<run id>/<searcher
    id>` in the group of the run's id, with the settings (the run's task and model) as config."""
    if not settings.searcher.wandb_on:
        return None
    from tba.wandb_sink import WandbRun, WandbSink, public_config

    name = f"{run.run_id}/{searcher_id}"
    wandb_run = WandbRun(run.run_id, "searcher", name, public_config(settings))
    return WandbSink(settings.searcher, wandb_run)


def build_reference(settings: SearcherRunSettings, tokenizer: Any, base: Any) -> ReferenceScorer:
    from tba.models.device import pick_device, pick_dtype
    from tba.searcher.reference import ReferenceScorer

    s = settings.searcher
    device = pick_device(settings.engine.device)
    dtype = pick_dtype(settings.engine.dtype, device)
    return ReferenceScorer(
        base,
        tokenizer.pad_token_id,
        s.reference_batch_size,
        device,
        dtype,
        s.reference_cache_tokens,
    )


def build_weight_sync(
    settings: SearcherRunSettings, client: BufferClient, engine: GenerationEngine
) -> WeightSync:
    from tba.objectstore import open_object_store
    from tba.searcher.weights import WeightSync

    s = settings.searcher
    weights_dir = Path(s.weights_dir)
    weights_dir.mkdir(parents=True, exist_ok=True)
    store = open_object_store(settings.objectstore)
    return WeightSync(client.latest_weights, store, engine, weights_dir, s.keep_weight_versions)


def build_engine(settings: SearcherRunSettings, base_seed: int) -> GenerationEngine:
    """The engine on the base model (`base_seed` builds `tiny`)."""
    if settings.engine.kind == "vllm":
        from tba.models.loading import materialize
        from tba.searcher.vllm_engine import VllmEngine

        base = Path(settings.searcher.weights_dir) / "base"
        base_dir = materialize(settings.model, base_seed, base)
        return VllmEngine(base_dir, settings.engine, settings.searcher.seed)
    from tba.models.loading import load_model
    from tba.searcher.hf_engine import TransformersEngine

    tokenizer, model = load_model(settings.model, base_seed)
    return TransformersEngine(model, tokenizer, settings.engine)


def seed_prompts(client: BufferClient, task: Task) -> int:
    """Puts the task's train prompts into the buffer (idempotent); the number new to it."""
    from tba.tasks.base import Split

    prompts = task.prompts(Split.TRAIN)
    created = 0
    for start in range(0, len(prompts), SEED_CHUNK_PROMPTS):
        created += client.put_prompts(prompts[start : start + SEED_CHUNK_PROMPTS]).created
    return created


def default_searcher_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
