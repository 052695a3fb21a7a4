"""The prior and target temperature schedules (`[trainer] prior_temperature_*`,
`target_temperature_*`) reach the loss: a loop step with them trains exactly as a step whose
target is written out by hand, the stored reference log-probs scaled by c = 1 / (gamma T)
and beta by T (`loss.tb_target`)."""

from __future__ import annotations

import dataclasses

import pytest

from tba.domain import Batch
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.trainer.config import OptimSettings, TrainerSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.loop import TrainerLoop
from tba.trainer.loss import TrajectoryBalance
from tba.trainer.reference import ReferenceResets
from tests.unit.test_trainer_golden import (
    TEMPERATURE,
    FixedSource,
    NoPublisher,
    NoSink,
    fixed_batch,
    one_thread,  # noqa: F401  (autouse: one thread, the golden steps' reduction order)
)

KEYS = ("trainer/loss", "trainer/log_z", "trainer/grad_norm")


def first_step(settings: TrainerSettings, scale_ref: float = 1.0) -> dict[str, float]:
    tokenizer = build_tiny_tokenizer("0123456789+=")
    model = build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2, seed=3)
    engine = LocalEngine(model, OptimSettings(lr=1e-2, max_grad_norm=1.0), settings.steps)
    loop = TrainerLoop(
        settings=settings,
        engine=engine,
        source=FixedSource(scaled(fixed_batch(tokenizer), scale_ref)),
        publisher=NoPublisher(),
        metrics=NoSink(),
        objective=TrajectoryBalance(),
        reference=ReferenceResets(0, TEMPERATURE, tokenizer.pad_token_id, 2),
        pad_token_id=tokenizer.pad_token_id,
        temperature=TEMPERATURE,
    )
    return loop.train_step()


def scaled(batch: Batch, factor: float) -> Batch:
    groups = [
        dataclasses.replace(
            g,
            trajectories=[
                dataclasses.replace(t, ref_logprob=t.ref_logprob * factor) for t in g.trajectories
            ],
        )
        for g in batch.groups
    ]
    return Batch(groups, batch.latest_version)


def settings(**changes: object) -> TrainerSettings:
    base = {"steps": 2, "num_prompts": 3, "samples_per_prompt": 4, "micro_batch_size": 3}
    return TrainerSettings(**{**base, "publish_every_steps": 1000, **changes})


def test_a_step_with_temperatures_trains_on_the_target_they_define():
    # Step 0: gamma = 2, T = 1.25, beta 0.5; so c = 1 / 2.5 = 0.4 and beta T = 0.625.
    tempered = first_step(
        settings(
            beta_start=0.5,
            beta_anneal_steps=0,
            prior_temperature_start=2.0,
            prior_temperature_end=1.0,
            prior_temperature_anneal_steps=10,
            target_temperature_start=1.25,
        )
    )
    by_hand = first_step(settings(beta_start=0.625, beta_anneal_steps=0), scale_ref=0.4)
    assert {k: tempered[k] for k in KEYS} == pytest.approx({k: by_hand[k] for k in KEYS}, rel=1e-5)
    assert tempered["trainer/beta"] == 0.5  # the beta schedule's own value
    assert tempered["trainer/prior_temperature"] == 2.0
    assert tempered["trainer/target_temperature"] == 1.25
    untempered = first_step(settings(beta_start=0.5, beta_anneal_steps=0))
    assert untempered["trainer/loss"] != pytest.approx(tempered["trainer/loss"], rel=1e-3)
    assert (untempered["trainer/prior_temperature"], untempered["trainer/target_temperature"]) == (
        1.0,
        1.0,
    )
