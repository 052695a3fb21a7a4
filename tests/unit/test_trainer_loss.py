"""The objectives against values computed by hand (DESIGN.md section 2)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tba.trainer.loss import (
    ImportanceClip,
    LossInputs,
    Objective,
    Rloo,
    TbTarget,
    TrajectoryBalance,
    beta_at,
    importance_weights,
    ramp_at,
    rloo_advantages,
    tb_delta,
    tb_log_z,
    tb_target,
)


def full_batch_loss(objective: Objective, logp: torch.Tensor, case: LossInputs, beta: float):
    """The loss over a whole batch from the two calls the trainer makes per micro-batch."""
    return objective.terms(logp, case, beta, objective.baselines(logp, case, beta)).mean()


def inputs(ref, reward, groups, behavior=None) -> LossInputs:
    ref_t = torch.tensor(ref, dtype=torch.float64)
    return LossInputs(
        ref_logprob=ref_t,
        behavior_logprob=torch.tensor(behavior or ref, dtype=torch.float64),
        reward=torch.tensor(reward, dtype=torch.float64),
        group_index=torch.tensor(groups),
        num_groups=max(groups) + 1,
    )


# Group 0: two completions; group 1: one. beta = 0.5.
#   delta = logp - ref - r / beta = [-1.5, -0.5 | -3];  log Z = [1 | 3]
#   residuals = [-0.5, 0.5 | 0];  L = (0.25 + 0.25 + 0) / 3 = 1/6
#   dL/dlogp = 2 * residual / N = [-1/3, 1/3, 0]
LOGP = [-1.0, -2.0, -3.0]
CASE = inputs(ref=[-1.5, -1.5, -2.0], reward=[1.0, 0.0, 1.0], groups=[0, 0, 1])


def test_tb_loss_and_gradient_by_hand():
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss = full_batch_loss(TrajectoryBalance(), logp, CASE, beta=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(1 / 6)
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-1 / 3, 1 / 3, 0.0])


def test_log_z_is_per_group_and_never_mixes_groups():
    logp = torch.tensor(LOGP, dtype=torch.float64)
    assert tb_log_z(logp, CASE, beta=0.5).tolist() == pytest.approx([1.0, 3.0])
    other = inputs(ref=[-1.5, -1.5, 7.0], reward=[1.0, 0.0, -4.0], groups=[0, 0, 1])
    assert tb_log_z(logp, other, beta=0.5)[0].item() == pytest.approx(1.0)


def test_clipped_importance_weights_by_hand():
    # ratios exp(logp - behaviour) = [e^0.5, e^-1, 1] clipped to [0.5, 1.5] -> [1.5, 0.5, 1]
    clip = ImportanceClip(0.5, 1.5)
    behaviour = torch.tensor([-1.5, -1.0, -3.0], dtype=torch.float64)
    weights = importance_weights(torch.tensor(LOGP, dtype=torch.float64), behaviour, clip)
    assert weights.tolist() == pytest.approx([1.5, 0.5, 1.0])
    # Weighted log Z of group 0: -(1.5 * -1.5 + 0.5 * -0.5) / 2 = 1.25; residuals
    # [-0.25, 0.75]; L = (1.5 * 0.0625 + 0.5 * 0.5625) / 3 = 0.125;
    # dL/dlogp = 2 w r / N = [-0.25, 0.25, 0].
    case = inputs([-1.5, -1.5, -2.0], [1.0, 0.0, 1.0], [0, 0, 1], behavior=[-1.5, -1.0, -3.0])
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss = full_batch_loss(TrajectoryBalance(clip), logp, case, beta=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(0.125)
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-0.25, 0.25, 0.0])


def test_without_importance_weights_every_weight_is_one():
    weights = importance_weights(torch.tensor(LOGP), torch.zeros(3), None)
    assert weights.tolist() == [1.0, 1.0, 1.0]


def random_case(seed: int, sizes: list[int]) -> tuple[torch.Tensor, LossInputs]:
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    logp = -torch.rand(n, generator=gen, dtype=torch.float64) * 20
    ref = logp.detach() - torch.randn(n, generator=gen, dtype=torch.float64)
    reward = (torch.rand(n, generator=gen) > 0.5).double()
    return logp, LossInputs(ref, logp.detach().clone(), reward, torch.tensor(groups), len(sizes))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tb_gradient_is_reinforce_with_mean_baseline_and_kl_in_the_reward(seed):
    logp, case = random_case(seed, sizes=[4, 2, 5, 1])
    beta = 0.1
    logp.requires_grad_(True)
    full_batch_loss(TrajectoryBalance(), logp, case, beta).backward()
    shaped = case.reward - beta * (logp.detach() - case.ref_logprob)
    baseline = torch.stack([shaped[case.group_index == g].mean() for g in case.group_index])
    expected = -(2 / (beta * len(shaped))) * (shaped - baseline)
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, expected)


def test_stopping_log_z_does_not_change_the_gradient():
    logp, case = random_case(3, sizes=[3, 4])
    beta = 0.2
    logp.requires_grad_(True)
    full_batch_loss(TrajectoryBalance(), logp, case, beta).backward()
    assert logp.grad is not None
    stopped = logp.grad.clone()
    live = logp.detach().clone().requires_grad_(True)
    delta = live - case.ref_logprob - case.reward / beta
    log_z = torch.stack([-delta[case.group_index == g].mean() for g in range(2)])
    ((log_z[case.group_index] + delta) ** 2).mean().backward()
    assert live.grad is not None
    torch.testing.assert_close(live.grad, stopped)


def test_rloo_advantages_and_gradient_by_hand():
    # beta 0.5, logp - ref = [0, -1, -2 | 0] -> r~ = r + [0, 0.5, 1 | 0] = [1, 0.5, 1 | 1]
    # A = [1 - 0.75, 0.5 - 1, 1 - 0.75 | 0 (alone)] = [0.25, -0.5, 0.25, 0]
    case = inputs(ref=[-1.0, -1.0, -1.0, -2.0], reward=[1.0, 0.0, 0.0, 1.0], groups=[0, 0, 0, 1])
    logp = torch.tensor([-1.0, -2.0, -3.0, -2.0], dtype=torch.float64, requires_grad=True)
    advantages = rloo_advantages(logp, case, beta=0.5)
    assert advantages.tolist() == pytest.approx([0.25, -0.5, 0.25, 0.0])
    loss = full_batch_loss(Rloo(), logp, case, beta=0.5)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-0.0625, 0.125, -0.0625, 0.0])


def test_tb_objective_baselines_are_log_z_of_each_row_group():
    logp = torch.tensor(LOGP, dtype=torch.float64)
    baselines = TrajectoryBalance().baselines(logp, CASE, beta=0.5)
    assert baselines.tolist() == pytest.approx([1.0, 1.0, 3.0])


def test_select_renumbers_groups_in_order():
    case = inputs(ref=[0.0] * 5, reward=[0.0] * 5, groups=[0, 0, 1, 2, 2])
    part = case.select(torch.tensor([3, 4, 1]))
    assert part.num_groups == 2
    assert part.group_index.tolist() == [1, 1, 0]


def test_linear_beta_schedule():
    assert beta_at(0, 0.014, 0.004, 500) == pytest.approx(0.014)
    assert beta_at(250, 0.014, 0.004, 500) == pytest.approx(0.009)
    assert beta_at(500, 0.014, 0.004, 500) == pytest.approx(0.004)
    assert beta_at(9000, 0.014, 0.004, 500) == pytest.approx(0.004)
    assert beta_at(7, 0.05, 0.01, 0) == 0.05
    assert math.isclose(beta_at(1, 1.0, 0.0, 4), 0.75)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1.0),  # the metrics' step 1: beta_start
        (16, 0.88125),  # 1 - 0.95 * 16 / 128, on the line towards step 128
        (30, 0.77734375),  # 1 - 0.95 * 30 / 128: the last step before the cut
        (31, 0.05),  # the metrics' step 32: cut to beta_end
        (64, 0.05),  # where the line alone would give 0.525
        (500, 0.05),
    ],
)
def test_tldr_beta_schedule_anneals_towards_step_128_and_cuts_at_step_32(step, expected):
    assert beta_at(step, 1.0, 0.05, 128, cut_step=32) == pytest.approx(expected, abs=1e-12)


def test_a_beta_cut_without_an_anneal_or_after_it_and_no_cut():
    assert [beta_at(s, 0.5, 0.1, 0, cut_step=3) for s in range(4)] == [0.5, 0.5, 0.1, 0.1]
    # A cut after the anneal's end changes nothing.
    assert beta_at(3, 1.0, 0.0, 4, cut_step=10) == pytest.approx(0.25)
    assert beta_at(4, 1.0, 0.0, 4, cut_step=10) == 0.0
    # cut_step 1: beta_end from the first step; 0: never cut.
    assert beta_at(0, 1.0, 0.0, 4, cut_step=1) == 0.0
    assert beta_at(2, 1.0, 0.0, 4, cut_step=0) == pytest.approx(0.5)


def test_prior_weight_by_hand():
    # beta = 0.5, prior weight c = 0.5; group 0 holds rows 0-1, group 1 row 2.
    #   delta = logp - c ref - r / beta = [-1 + 0.5 - 2, -2 + 1.5 - 0 | -3 + 1 - 2]
    #         = [-2.5, -0.5 | -4];  log Z = [1.5 | 4];  residuals = [-1, 1 | 0]
    #   L = (1 + 1 + 0) / 3 = 2/3;  dL/dlogp = 2 * residual / N = [-2/3, 2/3, 0]
    case = dataclasses.replace(
        inputs(ref=[-1.0, -3.0, -2.0], reward=[1.0, 0.0, 1.0], groups=[0, 0, 1]),
        prior_weight=0.5,
    )
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss = full_batch_loss(TrajectoryBalance(), logp, case, beta=0.5)
    loss.backward()
    assert tb_log_z(logp.detach(), case, beta=0.5).tolist() == pytest.approx([1.5, 4.0])
    assert loss.item() == pytest.approx(2 / 3)
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-2 / 3, 2 / 3, 0.0])
    # The default weight 1 is the unweighted target: delta = [-2, 1 | -3], L = 1.5.
    unweighted = dataclasses.replace(case, prior_weight=1.0)
    assert full_batch_loss(TrajectoryBalance(), logp, unweighted, 0.5).item() == 1.5


def test_tb_target_is_lee_et_al_prior_and_target_temperatures():
    # gamma 1.25, T 2: c = 1 / (1.25 * 2) = 0.4 and beta 0.5 * 2 = 1.
    target = tb_target(0.5, prior_temperature=1.25, target_temperature=2.0)
    assert (target.beta, target.prior_weight) == (1.0, pytest.approx(0.4))
    # Their target (log pi_ref / gamma + r / beta) / T, whatever the numbers.
    generator = torch.Generator().manual_seed(0)
    logp, ref, reward = torch.randn(3, 6, generator=generator, dtype=torch.float64)
    case = LossInputs(ref, ref, reward, torch.zeros(6, dtype=torch.long), 1)
    gamma, temperature, beta = 1.2, 1.5, 0.05
    target = tb_target(beta, gamma, temperature)
    weighted = dataclasses.replace(case, prior_weight=target.prior_weight)
    expected = logp - (ref / gamma + reward / beta) / temperature
    assert tb_delta(logp, weighted, target.beta).tolist() == pytest.approx(expected.tolist())


def test_without_temperatures_the_target_is_unchanged_exactly():
    for beta in (0.004, 0.05, 0.3):
        assert tb_target(beta, 1.0, 1.0) == TbTarget(beta, 1.0)


def test_select_keeps_the_prior_weight():
    case = dataclasses.replace(inputs([0.0] * 3, [0.0] * 3, [0, 1, 1]), prior_weight=0.25)
    assert case.select(torch.tensor([2])).prior_weight == 0.25


def test_ramp_is_linear_then_flat():
    # Lee et al.'s large red-teaming schedules: gamma 1 -> 1.2 over 2,000 steps, T 2 -> 1
    # over 1,000.
    assert [ramp_at(s, 1.0, 1.2, 2000) for s in (0, 1000, 2000, 5000)] == pytest.approx(
        [1.0, 1.1, 1.2, 1.2]
    )
    assert [ramp_at(s, 2.0, 1.0, 1000) for s in (0, 250, 1000, 4000)] == pytest.approx(
        [2.0, 1.75, 1.0, 1.0]
    )
    assert ramp_at(50, 3.0, 1.0, 0) == 3.0
