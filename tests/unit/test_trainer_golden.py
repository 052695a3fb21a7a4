"""Golden values of the trainer's first step: a fixed tiny model, a fixed batch, one
`TrainerLoop.train_step`, and its loss, log Z (RLOO: mean advantage), KL and grad norm as
recorded from the trainer as it was before the step was restructured (issue 18).

A change in any of them means the step computes something else: a new objective, another
reduction, a different micro-batch layout. Re-record only for a change meant to do that.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest
import torch

from tba.domain import (
    Batch,
    Prompt,
    PromptGroup,
    SampleSource,
    SampleSpec,
    Trajectory,
    pack_tokens,
)
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.trainer.config import OptimSettings, TrainerSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.loop import TrainerLoop
from tba.trainer.loss import ImportanceClip, Objective, Rloo, TrajectoryBalance
from tba.trainer.objectives import Grpo, OnlineDpo
from tba.trainer.publish import PublishProgress
from tba.trainer.reference import ReferenceResets

TEMPERATURE = 0.7
GOLDEN_KEYS = ("trainer/loss", "trainer/log_z", "trainer/kl", "trainer/grad_norm")
# (completion tokens, reward, stored ref log-prob, behaviour log-prob) per trajectory, by
# prompt; the groups differ in size as the buffer's dedup makes them.
GROUPS: dict[str, list[tuple[list[int], float, float, float]]] = {
    "1+2=": [
        ([6, 7, 2], 1.0, -7.5, -7.0),
        ([8, 2], 0.0, -5.0, -5.5),
        ([9, 9, 9, 2], 1.0, -10.0, -9.0),
    ],
    "3+4=": [([10, 2], 0.0, -4.5, -4.0), ([11, 12, 13, 2], 1.0, -11.0, -12.0)],
    "5+6=": [
        ([14, 2], 1.0, -5.5, -5.0),
        ([15, 6, 2], 0.0, -8.0, -8.5),
        ([7, 8, 9, 10, 2], 0.0, -13.0, -12.0),
        ([4, 2], 1.0, -4.0, -4.0),
    ],
}


class FixedSource:
    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def sample(self, spec: SampleSpec) -> Batch:
        return self.batch


class NoPublisher:
    def publish(self, step: int, after_version: int) -> None:
        raise AssertionError("the golden steps publish nothing")

    def progress(self) -> PublishProgress:
        return PublishProgress()

    def drain(self) -> PublishProgress:
        return PublishProgress()

    def close(self, wait: bool = True) -> None:
        return None


class NoSink:
    def write(self, step: int, values: Mapping[str, float]) -> None:
        return None

    def close(self) -> None:
        return None


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # One thread: the same reduction order in any process, whatever OMP_NUM_THREADS says.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fixed_batch(tokenizer) -> Batch:
    groups = []
    for prompt, rows in GROUPS.items():
        prompt_ids = pack_tokens(tokenizer(prompt).input_ids)
        trajectories = [
            Trajectory(
                prompt_id=prompt,
                prompt_token_ids=prompt_ids,
                completion_token_ids=pack_tokens(completion),
                completion_text="",
                reward=reward,
                ref_logprob=ref,
                behavior_logprob=behavior,
                policy_version=0,
            )
            for completion, reward, ref, behavior in rows
        ]
        groups.append(PromptGroup(Prompt(prompt, prompt), trajectories, SampleSource.RECENCY))
    return Batch(groups, latest_version=0)


def golden_loop(objective: Objective, micro_batch_size: int, reset_every: int) -> TrainerLoop:
    tokenizer = build_tiny_tokenizer("0123456789+=")
    model = build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2, seed=3)
    settings = TrainerSettings(
        steps=2,
        num_prompts=3,
        samples_per_prompt=4,
        micro_batch_size=micro_batch_size,
        beta_start=0.5,
        beta_end=0.25,
        beta_anneal_steps=1,
        publish_every_steps=1000,
        reference_reset_steps=reset_every,
    )
    engine = LocalEngine(model, OptimSettings(lr=1e-2, max_grad_norm=1.0), settings.steps)
    reference = ReferenceResets(reset_every, TEMPERATURE, tokenizer.pad_token_id, 2)
    return TrainerLoop(
        settings=settings,
        engine=engine,
        source=FixedSource(fixed_batch(tokenizer)),
        publisher=NoPublisher(),
        metrics=NoSink(),
        objective=objective,
        reference=reference,
        pad_token_id=tokenizer.pad_token_id,
        temperature=TEMPERATURE,
    )


@dataclass(frozen=True)
class Case:
    objective: Objective
    micro_batch_size: int
    golden: dict[str, float]  # GOLDEN_KEYS -> value
    reset_every_steps: int = 0
    steps: int = 1


def golden(loss: float, log_z: float, kl: float, grad_norm: float) -> dict[str, float]:
    return dict(zip(GOLDEN_KEYS, (loss, log_z, kl, grad_norm), strict=True))


CLIP = ImportanceClip(0.5, 1.5)
TB = golden(1.315556526184082, 1.7090123891830444, -0.5941353374057345, 15.78147029876709)
CASES = {
    "tb": Case(TrajectoryBalance(), 4, TB),
    # Micro-batches of 3 split the group of 4: constants from the whole batch first.
    "tb-split-groups": Case(TrajectoryBalance(), 3, TB),
    "tb-importance": Case(
        TrajectoryBalance(CLIP),
        4,
        golden(1.062314748764038, 1.4868494272232056, -0.5941353374057345, 13.191095352172852),
    ),
    # RLOO's `trainer/log_z` is the mean advantage, zero in every group by construction.
    "rloo": Case(
        Rloo(), 4, golden(0.4078623354434967, 0.0, -0.5941353374057345, 5.833027362823486)
    ),
    "rloo-importance": Case(
        Rloo(CLIP), 3, golden(-0.492203950881958, 0.0, -0.5941353374057345, 6.258261203765869)
    ),
    # Recorded when GRPO and online DPO came in (issue 17; their values by hand are in
    # test_trainer_objectives.py), with micro-batches of 3 that split the group of 4. Their
    # `trainer/log_z` is 0 by construction, as RLOO's.
    "grpo": Case(
        Grpo(0.2), 3, golden(0.3980166018009186, 0.0, -0.5941353374057345, 7.974579334259033)
    ),
    "online_dpo": Case(
        OnlineDpo(), 3, golden(0.2226649969816208, 0.0, -0.5941353374057345, 1.2991526126861572)
    ),
    # The second step, after a reset to the policy of step 1: reference log-probs are
    # recomputed (KL ~ 0), after a clipped AdamW step.
    "tb-after-reset": Case(
        TrajectoryBalance(),
        4,
        golden(3.8518526554107666, 2.222222089767456, 1.5894571940104166e-07, 34.44194793701172),
        reset_every_steps=1,
        steps=2,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_first_step_matches_the_golden_values(name):
    case = CASES[name]
    loop = golden_loop(case.objective, case.micro_batch_size, case.reset_every_steps)
    values: dict[str, float] = {}
    for _ in range(case.steps):
        values = loop.train_step()
    got = {key: values[key] for key in GOLDEN_KEYS}
    # abs: KL after a reset and RLOO's mean advantage are zero up to float32 rounding.
    assert got == pytest.approx(case.golden, rel=1e-5, abs=1e-6)
    assert values["trainer/reward_spread_groups"] == 3  # every group has mixed rewards
