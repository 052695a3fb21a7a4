"""`tba trainer run`: trains the policy from the buffer service and publishes weights.

One process by default. Data parallel with DeepSpeed ZeRO under its launcher, e.g.

    deepspeed --num_gpus 4 --no_local_rank --module tba trainer run \
        --set distributed.backend=deepspeed --set distributed.zero_stage=2

(or `torchrun --nproc_per_node 4 -m tba trainer run ...`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tba.cli import Flag
from tba.errors import FailedPreconditionError
from tba.heap import freeze_startup_objects
from tba.settings import CommandSettings
from tba.signals import stop_on_signals
from tba.trainer.config import (
    TrainerRunSettings,
    TrainerSettings,
)

if TYPE_CHECKING:
    from tba.trainer.engine import TrainEngine
    from tba.trainer.fill import InitialFill, StatsSource
    from tba.trainer.loop import TrainerLoop
    from tba.trainer.loss import Objective
    from tba.trainer.metrics import FanOut
    from tba.trainer.optim import RewardDecay

HELP = "Train the policy with Trajectory Balance on batches from the buffer; publish weights."
log = logging.getLogger(__name__)


SETTINGS = TrainerRunSettings
# Shown in `--help` as the example of `--set`.
SET_EXAMPLE = "optim.lr=1e-5"
FLAGS = (
    Flag(
        "--buffer",
        "client.address",
        "host:port of the buffer service's gRPC server",
        metavar="HOST:PORT",
    ),
    Flag("--steps", "trainer.steps", "optimizer steps to train", metavar="N"),
    Flag("--model", "model.source", "`tiny`, or a model directory / hub name", metavar="MODEL"),
    Flag(
        "--store",
        "objectstore.uri",
        "where weights go: file://PATH or s3://BUCKET/PREFIX",
        metavar="URI",
    ),
    Flag(
        "--checkpoint-dir",
        "checkpoint.dir",
        "checkpoint folder (resumed from if present)",
        metavar="DIR",
    ),
    Flag(
        "--metrics-jsonl",
        "metrics.jsonl_path",
        "append step metrics here as JSON lines",
        metavar="PATH",
    ),
    Flag(
        "--objective",
        "trainer.objective",
        "`tb` (default), `rloo`, `grpo` or `online_dpo`",
        metavar="OBJECTIVE",
    ),
)


def run(settings: CommandSettings) -> None:
    assert isinstance(settings, TrainerRunSettings)
    import torch

    from tba.models.loading import quiet_progress_bars

    torch.manual_seed(settings.trainer.seed)
    quiet_progress_bars()
    try:
        loop = build_loop(settings)
    except FailedPreconditionError as exc:
        raise SystemExit(f"trainer refused by the buffer: {exc}") from exc
    freeze_startup_objects()
    try:
        state = loop.run()
        if state.step < settings.trainer.steps:
            log.info("trainer stopped before its first step (the initial buffer fill)")
        else:
            log.info("trainer done: step %d, weight version %d", state.step, state.version)
    finally:
        loop.metrics.close()


def build_loop(settings: TrainerRunSettings) -> TrainerLoop:
    """Wires the real collaborators: buffer client, object store, engine, checkpoints."""
    from tba.buffer.transport.grpc_client import BufferClient
    from tba.models.device import DTYPES
    from tba.objectstore import open_object_store
    from tba.objectstore.weights import read_latest
    from tba.trainer.checkpoint import Checkpointer, LoopState
    from tba.trainer.loop import TrainerLoop
    from tba.trainer.model import load_policy
    from tba.trainer.optim import RewardDecay
    from tba.trainer.publish import StorePublisher
    from tba.trainer.reference import ReferenceResets
    from tba.trainer.registration import register_run

    t = settings.trainer
    tokenizer, model = load_policy(settings.model, seed=t.seed)
    reward_decay = RewardDecay(settings.optim) if settings.optim.decay_by == "reward" else None
    engine = build_engine(model, settings, reward_decay)
    client = BufferClient(settings.client)
    store = open_object_store(settings.objectstore)
    reference = ReferenceResets(
        t.reference_reset_steps,
        settings.temperature,
        tokenizer.pad_token_id,
        t.micro_batch_size,
        engine.forward_context,
    )
    checkpointer = Checkpointer(
        Path(settings.checkpoint.dir), settings.checkpoint.keep_last, engine
    )
    state = LoopState()
    latest = checkpointer.latest() if settings.checkpoint.resume else None
    if latest is not None:
        state = checkpointer.load(latest, reference)
        log.info("resumed from %s at step %d", latest, state.step)
        if reward_decay is not None:
            reward_decay.state = dict(state.reward_decay)
    run_id = ""
    if engine.rank == 0:
        client.wait_ready(settings.client.timeout_s)
        run_id = register_run(settings, tokenizer, model.config, client).run_id
        state.version = next_base_version(
            state.version, client.latest_weights(), read_latest(store)
        )
    state.version = engine.broadcast(state.version)
    return TrainerLoop(
        settings=t,
        engine=engine,
        source=client,
        publisher=StorePublisher(
            store,
            engine,
            tokenizer,
            client.announce_weights,
            t.keep_versions,
            retries=t.publish_retries,
            retry_backoff_s=t.publish_retry_backoff_s,
            export_dtype=DTYPES[settings.model.dtype],
            background=t.publish_in_background,
        ),
        metrics=build_metrics(settings, engine.rank, run_id),
        objective=build_objective(t),
        reference=reference,
        pad_token_id=tokenizer.pad_token_id,
        temperature=settings.temperature,
        checkpointer=checkpointer,
        checkpoint_every_steps=settings.checkpoint.every_steps,
        log_every_steps=settings.metrics.log_every_steps,
        state=state,
        reward_decay=reward_decay,
        initial_fill=build_initial_fill(t, client),
    )


def build_initial_fill(t: TrainerSettings, client: StatsSource) -> InitialFill | None:
    """The wait for `initial_buffer_completions` (None: off); SIGTERM and Ctrl-C end it."""
    from tba.trainer.fill import InitialFill

    if t.initial_buffer_completions == 0:
        return None
    return InitialFill(
        client, t.initial_buffer_completions, t.data_poll_s, stop_scope=stop_on_signals
    )


def build_metrics(settings: TrainerRunSettings, rank: int, run_id: str) -> FanOut:
    """The step metrics' sinks; the wandb run, if any, is `<run id>/trainer` in the group of
    the run's id, with the trainer's settings as config."""
    from tba.trainer.metrics import build_sinks
    from tba.wandb_sink import WandbRun, public_config

    wandb_run = WandbRun(run_id, "trainer", f"{run_id}/trainer", public_config(settings))
    return build_sinks(settings.metrics, rank, wandb_run)


def next_base_version(checkpointed: int, *announced: Any) -> int:
    """The newest version any record knows of (checkpoint, buffer, store); the loop publishes
    the one after it, so a version is never reused, even after a crash between publish and
    checkpoint."""
    return max([checkpointed, *(w.version for w in announced if w is not None)])


def build_objective(t: TrainerSettings) -> Objective:
    from tba.trainer.loop import importance_clip
    from tba.trainer.loss import Rloo, TrajectoryBalance
    from tba.trainer.objectives import Grpo, OnlineDpo

    if t.objective in ("grpo", "online_dpo"):
        if t.importance_weights:
            log.warning("trainer.importance_weights is ignored by objective %s", t.objective)
        return Grpo(t.grpo_clip_epsilon) if t.objective == "grpo" else OnlineDpo()
    clip = importance_clip(t)
    return Rloo(clip) if t.objective == "rloo" else TrajectoryBalance(clip)


def build_engine(
    model: Any, settings: TrainerRunSettings, reward_decay: RewardDecay | None = None
) -> TrainEngine:
    import os

    from tba.models.device import pick_device
    from tba.trainer.engine import LocalEngine

    bf16 = settings.model.dtype == "bf16"
    if settings.distributed.backend == "deepspeed":
        from tba.trainer.deepspeed_engine import DeepSpeedEngine

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        model.to(pick_device(settings.trainer.device, local_rank))
        return DeepSpeedEngine(
            model,
            settings.optim,
            settings.trainer.steps,
            settings.distributed.zero_stage,
            settings.trainer.micro_batch_size,
            bf16=bf16,
            comm_backend=settings.distributed.comm_backend,
            reward_decay=reward_decay,
        )
    device = pick_device(settings.trainer.device, index=0)
    return LocalEngine(model, settings.optim, settings.trainer.steps, bf16, device, reward_decay)
