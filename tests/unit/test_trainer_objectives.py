"""GRPO and online DPO (`tba.trainer.objectives`) against values computed by hand, and their
split into group constants and per-row terms under any micro-batch layout."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from tba.settings import load_settings
from tba.trainer.config import TrainerRunSettings
from tba.trainer.loss import LossInputs, Objective
from tba.trainer.main import build_objective
from tba.trainer.objectives import (
    GRPO_STD_EPS,
    Grpo,
    OnlineDpo,
    dpo_loss_shares,
    grpo_advantages,
    preference_pairs,
    reward_spread_groups,
)


def inputs(ref, reward, groups, behavior=None) -> LossInputs:
    return LossInputs(
        ref_logprob=torch.tensor(ref, dtype=torch.float64),
        behavior_logprob=torch.tensor(behavior or ref, dtype=torch.float64),
        reward=torch.tensor(reward, dtype=torch.float64),
        group_index=torch.tensor(groups),
        num_groups=max(groups) + 1,
    )


def loss_and_gradient(objective: Objective, logp: list[float], case: LossInputs, beta: float):
    """The full-batch loss sum_j terms_j / N (as the trainer computes it) and d loss / d logp."""
    policy = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    baselines = objective.baselines(policy, case, beta)
    loss = objective.terms(policy, case, beta, baselines).sum() / len(logp)
    loss.backward()
    assert policy.grad is not None
    return loss.item(), policy.grad.tolist()


def test_grpo_advantages_by_hand():
    # beta 0.5. Group 0: rewards [1, 0, 0], mean 1/3, deviations [2/3, -1/3, -1/3], sample
    # variance (4/9 + 1/9 + 1/9) / 2 = 1/3, so the divisor is 1/sqrt(3) + eps.
    # k = logp - ref = [0, -1, -2], centred [1, 0, -1], -beta * centred = [-0.5, 0, 0.5].
    # Group 1: one row -> 0. Group 2: equal rewards [1, 1] -> only the KL part: k = [0, 1],
    # centred [-0.5, 0.5] -> [0.25, -0.25].
    case = inputs(
        ref=[-1.0, -1.0, -1.0, -4.0, -2.0, -2.0],
        reward=[1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
        groups=[0, 0, 0, 1, 2, 2],
    )
    logp = torch.tensor([-1.0, -2.0, -3.0, -3.0, -2.0, -1.0], dtype=torch.float64)
    divisor = 1 / math.sqrt(3) + GRPO_STD_EPS
    expected = [
        (2 / 3) / divisor - 0.5,  # ~0.6545
        (-1 / 3) / divisor,  # ~-0.5772
        (-1 / 3) / divisor + 0.5,  # ~-0.0772
        0.0,
        0.25,
        -0.25,
    ]
    assert grpo_advantages(logp, case, beta=0.5).tolist() == pytest.approx(expected)


def test_grpo_clipped_and_unclipped_branches_by_hand():
    # Three groups of rewards [1, 0], KL 0 (logp = ref): A = [a, -a] in each, with
    # a = 0.5 / (sqrt(0.5) + eps) (sample std of [1, 0] is sqrt(0.5)). Clip epsilon 0.2.
    # log ratio logp - behaviour per row, and the branch min(ratio A, clip(ratio) A) takes:
    #   0:  0.1, A>0: ratio 1.105 inside [0.8, 1.2]      -> -1.105 a, grad -1.105 a
    #   1:  0.5, A<0: ratio 1.649 above, min is unclipped -> +1.649 a, grad +1.649 a
    #   2:  0.5, A>0: clipped to 1.2                      -> -1.2 a,   grad 0
    #   3: -0.5, A<0: ratio 0.607 below, clipped to 0.8   -> +0.8 a,   grad 0
    #   4: -0.5, A>0: unclipped                           -> -0.607 a, grad -0.607 a
    #   5:  0.0, A<0: ratio 1                             -> +a,       grad +a
    # The loss and gradient are these over N = 6.
    logp = [-1.0, -2.0, -3.0, -1.5, -2.5, -0.5]
    log_ratio = [0.1, 0.5, 0.5, -0.5, -0.5, 0.0]
    behaviour = [lp - lr for lp, lr in zip(logp, log_ratio, strict=True)]
    case = inputs(logp, [1.0, 0.0] * 3, [0, 0, 1, 1, 2, 2], behavior=behaviour)
    a = 0.5 / (math.sqrt(0.5) + GRPO_STD_EPS)
    e = math.exp
    terms = [-e(0.1) * a, e(0.5) * a, -1.2 * a, 0.8 * a, -e(-0.5) * a, a]
    grads = [-e(0.1) * a, e(0.5) * a, 0.0, 0.0, -e(-0.5) * a, a]
    loss, grad = loss_and_gradient(Grpo(clip_epsilon=0.2), logp, case, beta=0.5)
    assert loss == pytest.approx(sum(terms) / 6)
    assert grad == pytest.approx([g / 6 for g in grads])


def test_grpo_group_of_one_and_equal_rewards_without_kl_give_no_gradient():
    # A group of one, and a group whose rewards and KL are all equal: every A is 0.
    case = inputs(ref=[-1.0, -2.0, -2.0], reward=[1.0, 0.5, 0.5], groups=[0, 1, 1])
    loss, grad = loss_and_gradient(Grpo(), [-1.5, -2.5, -2.5], case, beta=0.1)
    assert loss == 0.0
    assert grad == [0.0, 0.0, 0.0]


# Online DPO, beta 0.5. Group 0: rewards [0.2, 0.9, 0.9] -> chosen row 1 (the first of the
# highest), rejected row 0. Group 1: equal rewards, no pair. Group 2: one row, no pair.
# Group 3: rewards [0, 1] -> chosen row 7, rejected row 6.
# log ratio logp - ref: row 1: 1, row 0: -1 -> m = 0.5 * (1 - (-1)) = 1;
#                       row 7: -2, row 6: 0 -> m = 0.5 * (-2 - 0) = -1.
# Pair losses softplus(-m): log(1 + e^-1) = 0.31326, log(1 + e) = 1.31326.
# d loss / d logp_chosen = -beta sigmoid(-m): -0.5 * 0.26894 = -0.13447 (group 0),
# -0.5 * 0.73106 = -0.36553 (group 3); the rejected rows the opposite. All over N = 8.
DPO_LOGP = [-2.0, -1.0, -1.5, -3.0, -3.0, -1.0, -1.0, -4.0]
DPO_CASE = inputs(
    ref=[-1.0, -2.0, -2.0, -3.0, -3.0, -1.0, -1.0, -2.0],
    reward=[0.2, 0.9, 0.9, 1.0, 1.0, 0.3, 0.0, 1.0],
    groups=[0, 0, 0, 1, 1, 2, 3, 3],
)


def test_dpo_pairs_best_against_worst_and_skip_equal_rewards():
    chosen, rejected = preference_pairs(DPO_CASE)
    assert chosen.tolist() == [1, 7]
    assert rejected.tolist() == [0, 6]
    assert reward_spread_groups(DPO_CASE) == 2


def test_dpo_loss_and_gradient_by_hand():
    near, far = math.log1p(math.exp(-1)), math.log1p(math.exp(1))  # 0.31326, 1.31326
    shares = dpo_loss_shares(torch.tensor(DPO_LOGP, dtype=torch.float64), DPO_CASE, beta=0.5)
    assert shares.tolist() == pytest.approx(
        [-near / 2, near / 2, 0.0, 0.0, 0.0, 0.0, -far / 2, far / 2]
    )
    loss, grad = loss_and_gradient(OnlineDpo(), DPO_LOGP, DPO_CASE, beta=0.5)
    assert loss == pytest.approx((near + far) / 8)  # 0.20332
    s_near, s_far = 1 / (1 + math.exp(1)), 1 / (1 + math.exp(-1))  # sigmoid(-1), sigmoid(1)
    expected = [0.5 * s_near, -0.5 * s_near, 0, 0, 0, 0, 0.5 * s_far, -0.5 * s_far]
    assert grad == pytest.approx([g / 8 for g in expected])


def test_dpo_without_pairs_has_zero_loss_and_gradient():
    case = inputs(ref=[-1.0, -2.0, -3.0], reward=[1.0, 1.0, 0.0], groups=[0, 0, 1])
    assert reward_spread_groups(case) == 0
    loss, grad = loss_and_gradient(OnlineDpo(), [-1.0, -5.0, -2.0], case, beta=0.1)
    assert (loss, grad) == (0.0, [0.0, 0.0, 0.0])


def random_case(seed: int) -> tuple[torch.Tensor, LossInputs]:
    """Groups of 4, 2, 5, 1 and 3 rows, rewards in {0, 0.5, 1} (ties), off-policy ratios."""
    gen = torch.Generator().manual_seed(seed)
    groups = torch.tensor([g for g, size in enumerate([4, 2, 5, 1, 3]) for _ in range(size)])
    n = groups.numel()
    logp = -torch.rand(n, generator=gen, dtype=torch.float64) * 10
    ref = logp - torch.randn(n, generator=gen, dtype=torch.float64)
    behaviour = logp - 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)
    reward = torch.randint(0, 3, (n,), generator=gen).double() / 2
    return logp, LossInputs(ref, behaviour, reward, groups, 5)


def dpo_loss_directly(logp: torch.Tensor, case: LossInputs, beta: float) -> torch.Tensor:
    """sum over pairs of -log sigmoid(m) / N, differentiated through both rows of a pair."""
    chosen, rejected = preference_pairs(case)
    log_ratio = logp - case.ref_logprob
    margin = beta * (log_ratio[chosen] - log_ratio[rejected])
    return F.softplus(-margin).sum() / logp.numel()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_surrogate_gives_the_loss_and_gradient_of_the_pairs(seed):
    logp, case = random_case(seed)
    expected = logp.clone().requires_grad_(True)
    direct = dpo_loss_directly(expected, case, beta=0.3)
    direct.backward()
    loss, grad = loss_and_gradient(OnlineDpo(), logp.tolist(), case, beta=0.3)
    assert loss == pytest.approx(direct.item())
    assert expected.grad is not None
    assert grad == pytest.approx(expected.grad.tolist())


def split_loss_and_gradient(
    objective: Objective, logp: torch.Tensor, case: LossInputs, chunks: list[list[int]], beta
):
    """The trainer's accumulation: group constants from the whole batch (the prepass), then
    sum over micro-batches of their terms / N, each backward on its own."""
    policy = logp.clone().requires_grad_(True)
    constants = objective.baselines(policy, case, beta)
    total = 0.0
    for chunk in chunks:
        rows = torch.tensor(chunk)
        part = objective.terms(policy[rows], case.select(rows), beta, constants[rows])
        part = part.sum() / logp.numel()
        part.backward()
        total += part.item()
    assert policy.grad is not None
    return total, policy.grad


@pytest.mark.parametrize("objective", [Grpo(0.2), OnlineDpo()], ids=["grpo", "online_dpo"])
@pytest.mark.parametrize(
    "chunks",
    [
        [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14]],  # groups 0 and 2 split
        [[i] for i in range(15)],  # one row per micro-batch
    ],
    ids=["split-groups", "rows"],
)
def test_micro_batches_that_split_groups_sum_to_the_full_batch(objective, chunks):
    logp, case = random_case(3)
    full_loss, full_grad = loss_and_gradient(objective, logp.tolist(), case, beta=0.2)
    loss, grad = split_loss_and_gradient(objective, logp, case, chunks, beta=0.2)
    assert loss == pytest.approx(full_loss)
    assert grad.tolist() == pytest.approx(full_grad)


@pytest.mark.parametrize("objective", [Grpo(0.2), OnlineDpo()], ids=["grpo", "online_dpo"])
def test_micro_batches_of_whole_groups_compute_their_own_constants(objective):
    # Without a prepass each micro-batch computes the constants of the groups it holds.
    logp, case = random_case(4)
    full_loss, full_grad = loss_and_gradient(objective, logp.tolist(), case, beta=0.2)
    policy = logp.clone().requires_grad_(True)
    loss = 0.0
    for chunk in ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14]):
        rows = torch.tensor(chunk)
        part_inputs = case.select(rows)
        constants = objective.baselines(policy[rows], part_inputs, 0.2)
        part = objective.terms(policy[rows], part_inputs, 0.2, constants).sum() / 15
        part.backward()
        loss += part.item()
    assert loss == pytest.approx(full_loss)
    assert policy.grad is not None
    assert policy.grad.tolist() == pytest.approx(full_grad)


@pytest.mark.parametrize(("name", "kind"), [("grpo", Grpo), ("online_dpo", OnlineDpo)])
def test_settings_accept_the_new_objectives(name, kind):
    settings = load_settings(TrainerRunSettings, overrides={"trainer.objective": name})
    assert isinstance(build_objective(settings.trainer), kind)


def test_grpo_clip_epsilon_reaches_the_objective_and_is_bounded():
    overrides = {"trainer.objective": "grpo", "trainer.grpo_clip_epsilon": "0.1"}
    objective = build_objective(load_settings(TrainerRunSettings, overrides=overrides).trainer)
    assert objective == Grpo(clip_epsilon=0.1)
    for bad in ("0", "1"):
        with pytest.raises(ValidationError, match="grpo_clip_epsilon"):
            load_settings(TrainerRunSettings, overrides={"trainer.grpo_clip_epsilon": bad})


def test_unknown_objective_is_refused():
    with pytest.raises(ValidationError, match="objective"):
        load_settings(TrainerRunSettings, overrides={"trainer.objective": "ppo"})


def test_importance_weights_are_ignored_by_grpo_with_a_warning(caplog):
    overrides = {"trainer.objective": "grpo", "trainer.importance_weights": "true"}
    settings = load_settings(TrainerRunSettings, overrides=overrides)
    with caplog.at_level(logging.WARNING, logger="tba.trainer.main"):
        assert build_objective(settings.trainer) == Grpo(clip_epsilon=0.2)
    assert "importance_weights is ignored by objective grpo" in caplog.text
