"""The training loop: draw a batch from the buffer, train on it (`trainer.step`), publish
weights every k steps, checkpoint every n, log the step's metrics.

Collaborators are injected: a `BatchSource` (the buffer client's `sample`), a
`WeightPublisher`, a `MetricsSink`, a `Clock`, the `TrainEngine`, an optional
`Checkpointer` and an optional `InitialFill`. Every phase is timed (`time/wait_data_s`,
`time/compute_s`, `time/publish_s`, `time/checkpoint_s`; the initial fill, once, at step 0:
`time/initial_fill_s`). Under data parallelism every rank runs this loop; rank
0 draws the batch and the others receive it.

Publishing in the background, the publish phase only takes a snapshot of the weights
(`time/publish_blocking_s`, which `time/publish_s` then equals); the version is written and
announced while the next steps run (`time/publish_background_s`, `trainer/publish_skipped`,
`trainer/publish_failed`). The loop state (so a checkpoint, and `trainer/version`) holds the
newest version announced when the step ended: one still on its way is not in it, and a
resumed trainer publishes after the newest version any record knows of
(`trainer.main.next_base_version`), so a version is never reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tba.clock import Clock, SystemClock
from tba.domain import Batch, SampleSpec, TrainerReport, WeightVersion
from tba.trainer.checkpoint import Checkpointer, LoopState
from tba.trainer.config import TrainerSettings
from tba.trainer.engine import TrainEngine
from tba.trainer.fill import InitialFill
from tba.trainer.loss import ImportanceClip, Objective, beta_at, ramp_at, tb_target
from tba.trainer.metrics import MetricsSink
from tba.trainer.optim import RewardDecay
from tba.trainer.publish import PublishFailedError, PublishProgress
from tba.trainer.reference import ReferenceResets
from tba.trainer.step import Scoring, step_metrics, train_on_batch


class BatchSource(Protocol):
    def sample(self, spec: SampleSpec) -> Batch: ...


class WeightPublisher(Protocol):
    def publish(self, step: int, after_version: int) -> None:
        """Publishes the weights after `step` as a version newer than `after_version` and
        announces it, at once or in the background."""
        ...

    def progress(self) -> PublishProgress: ...

    def drain(self) -> PublishProgress:
        """Waits until every publish handed over has ended."""
        ...

    def close(self, wait: bool = True) -> None: ...


class DataTimeoutError(TimeoutError):
    """The buffer had too few prompt groups for longer than `data_timeout_s`."""


@dataclass
class TrainerLoop:
    settings: TrainerSettings
    engine: TrainEngine
    source: BatchSource
    publisher: WeightPublisher
    metrics: MetricsSink
    objective: Objective
    reference: ReferenceResets
    pad_token_id: int
    # The searchers' sampling temperature: log-probs of logits / temperature.
    temperature: float
    clock: Clock = field(default_factory=SystemClock)
    checkpointer: Checkpointer | None = None
    checkpoint_every_steps: int = 0
    log_every_steps: int = 1
    state: LoopState = field(default_factory=LoopState)
    # The schedule's progress when it decays by reward (the engine's scheduler reads it).
    reward_decay: RewardDecay | None = None
    # The latest step's metrics, sent with the next Sample call for the buffer's history.
    report: TrainerReport | None = None
    # The step whose weights were last handed to the publisher (None: state.published_step).
    handed_step: int | None = None
    # The wait before a fresh run's first step (`initial_buffer_completions`); None: none.
    initial_fill: InitialFill | None = None

    def run(self) -> LoopState:
        """Trains until `settings.steps`; publishes and checkpoints the final state. Raises
        PublishFailedError (after the checkpoint) if the final weights could not be
        published. A shutdown during the initial fill ends the run before its first step,
        with nothing trained, published or checkpointed beyond the starting weights."""
        try:
            # The starting weights, so that searchers tag their first rounds with a version.
            if self.settings.publish_initial and self._handed() < 0:
                self.publish()
            # Initial fill: a fresh run waits until the buffer holds enough completions.
            filled = self.wait_for_initial_fill()
            if filled:
                self.train()
        except BaseException:
            self.publisher.close(wait=False)
            raise
        self.publisher.close()
        if filled and self.engine.rank == 0 and self.state.published_step != self.state.step:
            raise PublishFailedError(
                f"the weights of the final step {self.state.step} were not published "
                f"(the newest version announced is {self.state.version})"
            )
        return self.state

    def wait_for_initial_fill(self) -> bool:
        """Rank 0 waits for the initial fill (a fresh run only: one resumed past step 0 goes on
        at once) and logs its time at step 0 (`time/initial_fill_s`); every rank learns
        whether the buffer filled (True) or a shutdown ended the wait (False)."""
        if self.initial_fill is None or self.state.step > 0:
            return True
        started = self.clock.monotonic()
        held = self.initial_fill.wait() if self.engine.rank == 0 else None
        filled = self.engine.broadcast(held is not None)
        if held is not None:
            values = {"time/initial_fill_s": self.clock.monotonic() - started}
            self.metrics.write(0, {**values, "trainer/initial_fill_completions": float(held)})
        return filled

    def train(self) -> None:
        """Steps until `settings.steps`, then publishes and checkpoints the final state."""
        while self.state.step < self.settings.steps:
            self.train_step()
        if self._handed() != self.state.step:
            self.publish()
        self._absorb(self.publisher.drain())
        if self.checkpointer is not None:
            self.checkpointer.save(self.state, self.reference)

    def train_step(self) -> dict[str, float]:
        """One step, each phase timed: draw a batch, train on it (`trainer.step`), publish
        every k steps, checkpoint, log."""
        s = self.settings
        started = self.clock.monotonic()
        # Draw: rank 0 waits for enough prompt groups; every rank trains on its batch.
        batch = self.next_batch()
        waited = self.clock.monotonic()
        beta = beta_at(
            self.state.step, s.beta_start, s.beta_end, s.beta_anneal_steps, s.beta_cut_step
        )
        temperatures = target_temperatures(s, self.state.step)
        target = tb_target(beta, *temperatures)
        # Train: collate, reference and policy log-probs, loss, backward, optimizer step.
        result = train_on_batch(
            batch,
            engine=self.engine,
            objective=self.objective,
            reference=self.reference,
            scoring=self._scoring(),
            micro_batch_size=s.micro_batch_size,
            beta=target.beta,
            step=self.state.step,
            reward_decay=self.reward_decay,
            prior_weight=target.prior_weight,
        )
        self._advance(beta)
        computed = self.clock.monotonic()
        # Publish the weights every k steps.
        if self.state.step % s.publish_every_steps == 0:
            self.publish()
        published = self.clock.monotonic()
        progress = self.publisher.progress()
        self._absorb(progress)
        # Checkpoint every n steps (the final state is saved by `run`).
        if self._checkpoint_due():
            assert self.checkpointer is not None
            self.checkpointer.save(self.state, self.reference)
        done = self.clock.monotonic()
        times = (waited - started, computed - waited, published - computed, done - published)
        values = step_metrics(result, beta=beta, version=self.state.version, times=times)
        values.update(publish_metrics(progress, blocking_s=published - computed))
        values["trainer/prior_temperature"], values["trainer/target_temperature"] = temperatures
        self.report = trainer_report(self.state.step, values)
        if self.state.step % self.log_every_steps == 0:
            self.metrics.write(self.state.step, values)
        return values

    def _scoring(self) -> Scoring:
        """How the step scores rows; the clip rides along when it is per token (the step
        computes those weights from the policy's token log-probs)."""
        clip = importance_clip(self.settings)
        token_clip = clip if clip is not None and clip.level == "token" else None
        return Scoring(self.temperature, self.pad_token_id, token_clip)

    def publish(self) -> WeightVersion | None:
        """Hands the current weights to the publisher; the newest version announced (the
        one just published, unless it goes out in the background)."""
        self.publisher.publish(self.state.step, after_version=self.state.version)
        self.handed_step = self.state.step
        return self._absorb(self.publisher.progress())

    def _handed(self) -> int:
        return self.state.published_step if self.handed_step is None else self.handed_step

    def _absorb(self, progress: PublishProgress) -> WeightVersion | None:
        announced = progress.announced
        if announced is not None and announced.version > self.state.version:
            self.state.version = announced.version
            self.state.published_step = announced.step
        return announced

    def next_batch(self) -> Batch:
        """Rank 0 draws until the batch has `min_batch_prompts` groups; all ranks get it."""
        batch = self._wait_for_batch() if self.engine.rank == 0 else None
        received = self.engine.broadcast(batch)
        assert received is not None
        return received

    def _wait_for_batch(self) -> Batch:
        started = self.clock.monotonic()
        timeout_s = self.settings.data_timeout_s
        attempt = 0
        while True:
            elapsed_s = self.clock.monotonic() - started
            wait_s = self.settings.sample_wait_s
            if timeout_s > 0:
                wait_s = min(wait_s, max(0.0, timeout_s - elapsed_s))
            batch = self.source.sample(self._spec(attempt, wait_s))
            if sum(1 for g in batch.groups if g.trajectories) >= self.settings.min_batch_prompts:
                return batch
            elapsed_s = self.clock.monotonic() - started
            if 0 < timeout_s <= elapsed_s:
                raise DataTimeoutError(
                    f"buffer had fewer than {self.settings.min_batch_prompts} prompt groups "
                    f"for {elapsed_s:.1f} s"
                )
            if batch.waited_s == 0:  # no long poll (or a buffer without one): poll
                self.clock.sleep(self.settings.data_poll_s)
            attempt += 1

    def _spec(self, attempt: int, wait_s: float) -> SampleSpec:
        # Seeded by (run seed, step, attempt): a resumed run asks for the draws it would have.
        seed = np.random.SeedSequence([self.settings.seed, self.state.step, attempt])
        s = self.settings
        return SampleSpec(
            num_prompts=s.num_prompts,
            samples_per_prompt=s.samples_per_prompt,
            recency_probability=s.recency_probability,
            reward_temperature=s.reward_temperature or float("inf"),
            max_age_versions=s.max_age_versions,
            min_samples_per_prompt=s.min_samples_per_prompt,
            seed=int(seed.generate_state(1)[0]),
            report=self.report,
            min_groups=s.min_batch_prompts,
            wait_s=wait_s,
        )

    def _advance(self, beta: float) -> None:
        self.state.step += 1
        self.state.beta = beta
        if self.reward_decay is not None:
            self.state.reward_decay = self.reward_decay.state

    def _checkpoint_due(self) -> bool:
        every = self.checkpoint_every_steps
        last = self.state.step >= self.settings.steps
        return (
            self.checkpointer is not None
            and every > 0
            and self.state.step % every == 0
            and not last
        )


def importance_clip(t: TrainerSettings) -> ImportanceClip | None:
    """The clip `tb` and `rloo` weigh trajectories with; None without `importance_weights`."""
    if not t.importance_weights:
        return None
    return ImportanceClip(t.importance_weight_min, t.importance_weight_max, t.importance_clip_level)


def target_temperatures(s: TrainerSettings, step: int) -> tuple[float, float]:
    """(gamma, T) of the step after `step` steps: the prior's and the whole target's
    temperatures (`loss.tb_target`), each linear over its anneal like beta."""
    prior = ramp_at(
        step, s.prior_temperature_start, s.prior_temperature_end, s.prior_temperature_anneal_steps
    )
    target = ramp_at(
        step,
        s.target_temperature_start,
        s.target_temperature_end,
        s.target_temperature_anneal_steps,
    )
    return prior, target


def publish_metrics(progress: PublishProgress, *, blocking_s: float) -> dict[str, float]:
    return {
        "time/publish_blocking_s": blocking_s,
        "time/publish_background_s": progress.background_s,
        "trainer/publish_skipped": float(progress.skipped),
        "trainer/publish_failed": float(progress.failed),
    }


def trainer_report(step: int, values: dict[str, float]) -> TrainerReport:
    """What of a step's metrics (`step_metrics`) the buffer's history keeps."""
    return TrainerReport(
        step=step,
        loss=values["trainer/loss"],
        kl=values["trainer/kl"],
        log_z=values["trainer/log_z"],
        lr=values["trainer/lr"],
        grad_norm=values["trainer/grad_norm"],
        step_time_s=sum(values[f"time/{phase}_s"] for phase in _PHASES),
        wait_data_s=values["time/wait_data_s"],
    )


_PHASES = ("wait_data", "compute", "publish", "checkpoint")
