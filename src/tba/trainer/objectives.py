"""GRPO and online DPO: comparison objectives on TB's data path (DESIGN.md section 2).

Both split like TB and RLOO (`tba.trainer.loss`): `baselines` are [n] stop-gradient constants
that need the whole prompt group, `terms` are per row, and the loss is sum_j terms_j / N over
all N trajectories of the batch, so a micro-batch holding part of a group computes exactly its
share of the full-batch loss and gradient. beta is the step's KL coefficient, as for TB.

GRPO, with k_j = log pi_theta(y_j) - log pi_ref(y_j) (stop-gradient, sequence sums):

    A_j     = (r_j - mean_g r) / (std_g r + eps) - beta (k_j - mean_g k)     (0 alone in a group)
    ratio_j = exp(log pi_theta(y_j) - log pi_behaviour(y_j))                 (sequence sums)
    L       = -sum_j min(ratio_j A_j, clip(ratio_j, 1 - c, 1 + c) A_j) / N

std_g is the sample standard deviation (n - 1), eps = 1e-4 (as TRL's GRPO), c the setting
`grpo_clip_epsilon`. The rewards are normalised on their own and the KL penalty is a separate,
un-normalised term of the advantage, rather than normalising the KL-shaped reward
r~ = r - beta k as a whole: with 0/1 rewards many groups have equal rewards, and normalising
r~ there would scale the KL differences alone up to unit-size advantages. Rewards normalised
alone match GRPO as published (an all-equal group carries no reward signal), and the KL term
in score-function form, -beta (k_j - mean_g k), is the same KL gradient TB and RLOO carry on
on-policy data, where GRPO's per-token KL estimator needs per-token log-probs, which
trajectories carry only from searchers that send them. The ratio is per sequence for the same
reason.

Online DPO: in each group the first row of highest reward (w) against the first of lowest (l);
no pair when all rewards are equal (a group of one included). With m = beta ((log pi_theta(y_w)
- log pi_ref(y_w)) - (log pi_theta(y_l) - log pi_ref(y_l))):

    L = sum_pairs -log sigmoid(m) / N

so the normaliser is N trajectories, not the number of pairs (a micro-batch cannot know the
batch's pair count); with full groups of K that is the mean pair loss times pairs / (N / K).
A row's gradient needs its partner's log-prob: `baselines` holds each paired row's half of its
pair's loss, signed + for w and - for l, and `terms` turn it into a surrogate whose value is
that half and whose gradient is exact, d L_pair / d log pi(y_w) = -beta sigmoid(-m)
= -beta (1 - exp(-L_pair)) (and the opposite for l): one constant carries both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tba.trainer.loss import LossInputs, group_mean, group_sum

# Keeps a group whose rewards barely differ from dividing by ~0 (TRL's GRPO uses the same).
GRPO_STD_EPS = 1e-4


def group_std(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[num_groups] sample standard deviation (n - 1 denominator) of each group; 0 for one row."""
    centred = values - group_mean(values, group_index, num_groups)[group_index]
    squares = group_sum(centred**2, group_index, num_groups)
    counts = group_sum(torch.ones_like(values), group_index, num_groups)
    return (squares / (counts - 1).clamp(min=1)).sqrt()


def grpo_advantages(policy_logprob: torch.Tensor, inputs: LossInputs, beta: float) -> torch.Tensor:
    """[n] A_j = (r_j - mean_g r) / (std_g r + eps) - beta (k_j - mean_g k), stop-gradient.
    A row alone in its group gets 0: both parts are centred on the row itself."""
    g, groups = inputs.group_index, inputs.num_groups
    reward = inputs.reward
    spread = group_std(reward, g, groups)[g]
    normalised = (reward - group_mean(reward, g, groups)[g]) / (spread + GRPO_STD_EPS)
    kl = policy_logprob.detach() - inputs.ref_logprob
    return normalised - beta * (kl - group_mean(kl, g, groups)[g])


@dataclass(frozen=True)
class Grpo:
    """GRPO's clipped surrogate on group-normalised advantages (module doc)."""

    clip_epsilon: float = 0.2

    def baselines(
        self, policy_logprob: torch.Tensor, inputs: LossInputs, beta: float
    ) -> torch.Tensor:
        return grpo_advantages(policy_logprob, inputs, beta)

    def terms(
        self,
        policy_logprob: torch.Tensor,
        inputs: LossInputs,
        beta: float,
        baselines: torch.Tensor,
    ) -> torch.Tensor:
        ratio = torch.exp(policy_logprob - inputs.behavior_logprob)
        clipped = ratio.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon)
        return -torch.minimum(ratio * baselines, clipped * baselines)


def group_extreme_rows(
    values: torch.Tensor, group_index: torch.Tensor, num_groups: int, *, highest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_groups] the extreme (max or min) value of each group and the first row holding it;
    the first, so that ties resolve the same in any subset that keeps the rows' order."""
    reduce = "amax" if highest else "amin"
    fill = -torch.inf if highest else torch.inf
    extreme = values.new_full((num_groups,), fill).scatter_reduce(0, group_index, values, reduce)
    n = values.numel()
    rows = torch.arange(n, device=values.device)
    holders = torch.where(values == extreme[group_index], rows, n)
    first = torch.full((num_groups,), n, device=values.device)
    return extreme, first.scatter_reduce(0, group_index, holders, "amin")


def preference_pairs(inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of (chosen, rejected) per group whose rewards are not all equal."""
    g, groups = inputs.group_index, inputs.num_groups
    best, chosen = group_extreme_rows(inputs.reward, g, groups, highest=True)
    worst, rejected = group_extreme_rows(inputs.reward, g, groups, highest=False)
    paired = best > worst
    return chosen[paired], rejected[paired]


def reward_spread_groups(inputs: LossInputs) -> int:
    """Groups whose rewards are not all equal: online DPO's pairs, and the groups where
    GRPO's and RLOO's advantages carry a reward signal."""
    return int(preference_pairs(inputs)[0].numel())


def dpo_loss_shares(policy_logprob: torch.Tensor, inputs: LossInputs, beta: float) -> torch.Tensor:
    """[n] half of each pair's -log sigmoid(m), + on the chosen row and - on the rejected one;
    0 on unpaired rows. Stop-gradient."""
    chosen, rejected = preference_pairs(inputs)
    log_ratio = policy_logprob.detach() - inputs.ref_logprob
    margin = beta * (log_ratio[chosen] - log_ratio[rejected])
    half = F.softplus(-margin) / 2  # -log sigmoid(m), computed without overflow
    shares = torch.zeros_like(log_ratio)
    shares[chosen] = half
    shares[rejected] = -half
    return shares


@dataclass(frozen=True)
class OnlineDpo:
    """DPO on best-vs-worst pairs of each group, beta the step's KL coefficient (module doc)."""

    def baselines(
        self, policy_logprob: torch.Tensor, inputs: LossInputs, beta: float
    ) -> torch.Tensor:
        return dpo_loss_shares(policy_logprob, inputs, beta)

    def terms(
        self,
        policy_logprob: torch.Tensor,
        inputs: LossInputs,
        beta: float,
        baselines: torch.Tensor,
    ) -> torch.Tensor:
        share = baselines.abs()
        # beta sigmoid(-m) from the pair's loss 2 * share: sigmoid(-m) = 1 - exp(-loss).
        slope = beta * -torch.expm1(-2 * share)
        coefficient = -torch.sign(baselines) * slope
        # Value: `share` (the added part is exactly 0); gradient: `coefficient`.
        return share + coefficient * (policy_logprob - policy_logprob.detach())
