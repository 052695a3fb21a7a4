"""The training objectives as pure tensor functions (DESIGN.md section 2).

Trajectory Balance, per prompt group g with completions j:

    delta_j  = log pi_theta(y_j|x) - c log pi_ref(y_j|x) - r_j / beta    (sequence sums)
    log Z_g  = stop_grad(-mean_{j in g} delta_j)                         (VarGrad estimate)
    L        = sum_j w_j (log Z_g(j) + delta_j)^2 / N                    (N: all trajectories)

with c the weight of the reference prior, 1 unless the red-teaming schedules of Lee et al.
(2024) set it (`tb_target`): their target is (log pi_ref / gamma + r / beta) / T, a prior
temperature gamma and a temperature T of the whole target, so c = 1 / (gamma T) and the
reward's beta becomes beta T.

with w_j = 1, or, behind config, clipped importance weights stop_grad(clip(exp(log pi_theta
- log pi_behaviour))) of the sequence, or the mean of its tokens' clipped ratios
(`importance_clip_level = "token"`, `tba.trainer.tokens`). With weights, log Z_g is the
weighted mean, the log Z that minimises the weighted loss, so that the gradient is the same
whether or not log Z is stopped.

On on-policy data the TB gradient is -(2 / (beta N)) sum_j (r~_j - mean_g r~) grad log pi(y_j)
with r~ = r - beta (log pi_theta - log pi_ref): REINFORCE with a per-prompt mean baseline and
the KL penalty in the reward, scaled by 2 / beta.

The baseline objective for comparisons on the same data is RLOO: advantages
A_j = r~_j - mean_{i in g, i != j} r~_i (zero for a group of one) and L = -sum_j w_j A_j log
pi_theta(y_j) / N.

Both objectives split into per-trajectory constants that need the whole group (log Z, or the
advantage: `baselines`) and per-trajectory terms (`terms`), so a micro-batch that holds only
part of a group still computes exactly its share of the full-batch loss. GRPO and online DPO,
on the same split and data path, are in `tba.trainer.objectives` with their formulas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch


@dataclass(frozen=True)
class LossInputs:
    """What the loss needs of each trajectory besides the policy log-prob, as [n] tensors;
    `group_index` maps each row to its prompt group in 0..num_groups-1."""

    ref_logprob: torch.Tensor
    behavior_logprob: torch.Tensor
    reward: torch.Tensor
    group_index: torch.Tensor
    num_groups: int
    # c: the weight of log pi_ref in the TB target this step, the same for every row.
    prior_weight: float = 1.0
    # Token-level importance weights (`tba.trainer.tokens`), set by the step when the clip
    # is per token: they need the policy's per-token log-probs, which the loss never sees.
    token_weight: torch.Tensor | None = None

    def select(self, rows: torch.Tensor) -> LossInputs:
        """The rows `rows`, with their groups renumbered 0..g-1 in order of appearance."""
        groups, local = torch.unique(self.group_index[rows], sorted=True, return_inverse=True)
        return LossInputs(
            self.ref_logprob[rows],
            self.behavior_logprob[rows],
            self.reward[rows],
            local,
            int(groups.numel()),
            self.prior_weight,
            None if self.token_weight is None else self.token_weight[rows],
        )


@dataclass(frozen=True)
class ImportanceClip:
    """Bounds of the importance weight exp(log pi_theta - log pi_behaviour): of the sequence
    (`level` "sequence"), or of each token, a trajectory weighing the mean of its tokens'
    clipped ratios ("token", `tba.trainer.tokens`)."""

    min_weight: float
    max_weight: float
    level: Literal["sequence", "token"] = "sequence"


def ramp_at(step: int, start: float, end: float, anneal_steps: int) -> float:
    """Linear from `start` at step 0 to `end` at `anneal_steps`, then flat (0: `start`)."""
    if anneal_steps <= 0:
        return start
    fraction = min(max(step, 0), anneal_steps) / anneal_steps
    return start + (end - start) * fraction


def beta_at(
    step: int, beta_start: float, beta_end: float, anneal_steps: int, cut_step: int = 0
) -> float:
    """Beta of the step after `step` steps (0-based, so the metrics' step `step + 1`): linear
    from `beta_start` at step 0 to `beta_end` at `anneal_steps`, then flat; from the metrics'
    step `cut_step` on (`step + 1 >= cut_step`), `beta_end` at once, however far the anneal
    has gone (0: no cut). The paper's TL;DR run anneals 1 -> 0.05 towards step 128 and cuts at
    step 32, as its reference code does (`kl_coef_decay_stop_iter`, steps counted from 1)."""
    if 0 < cut_step <= step + 1:
        return beta_end
    return ramp_at(step, beta_start, beta_end, anneal_steps)


@dataclass(frozen=True)
class TbTarget:
    """What the TB target log R = c log pi_ref + r / beta is at one step."""

    beta: float
    prior_weight: float


def tb_target(beta: float, prior_temperature: float, target_temperature: float) -> TbTarget:
    """Lee et al.'s red-teaming target (log pi_ref / gamma + r / beta) / T in this module's
    form: c = 1 / (gamma T) and beta T (GFNOrg/red-teaming, trainers/gfn_trainer.py,
    `get_batch_metrics`: gamma is `get_lm_reward_temp`, T `get_total_reward_temp`). With
    gamma = T = 1 the target is exactly log pi_ref + r / beta."""
    return TbTarget(beta * target_temperature, 1.0 / (prior_temperature * target_temperature))


def group_mean(
    values: torch.Tensor,
    group_index: torch.Tensor,
    num_groups: int,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """[num_groups] (weighted) mean of `values` over the rows of each group."""
    w = torch.ones_like(values) if weights is None else weights.to(values.dtype)
    sums = group_sum(values * w, group_index, num_groups)
    totals = group_sum(w, group_index, num_groups)
    return sums / totals.clamp(min=torch.finfo(values.dtype).tiny)


def group_sum(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    return values.new_zeros(num_groups).index_add_(0, group_index, values)


def importance_weights(
    policy_logprob: torch.Tensor, behavior_logprob: torch.Tensor, clip: ImportanceClip | None
) -> torch.Tensor:
    """Stop-gradient sequence importance weights, clipped; ones when `clip` is None."""
    if clip is None:
        return torch.ones_like(policy_logprob).detach()
    ratio = torch.exp(policy_logprob.detach() - behavior_logprob)
    return ratio.clamp(min=clip.min_weight, max=clip.max_weight)


def trajectory_weights(
    policy_logprob: torch.Tensor, inputs: LossInputs, clip: ImportanceClip | None
) -> torch.Tensor:
    """The objective's stop-gradient weight of each row: sequence-level `importance_weights`,
    or at token level the step's `inputs.token_weight`."""
    if clip is None or clip.level == "sequence":
        return importance_weights(policy_logprob, inputs.behavior_logprob, clip)
    if inputs.token_weight is None:
        raise ValueError("token-level importance clipping needs LossInputs.token_weight")
    return inputs.token_weight


def tb_delta(policy_logprob: torch.Tensor, inputs: LossInputs, beta: float) -> torch.Tensor:
    """delta_j = log pi_theta - c log pi_ref - r / beta (c: `inputs.prior_weight`)."""
    return policy_logprob - inputs.prior_weight * inputs.ref_logprob - inputs.reward / beta


def tb_log_z(
    policy_logprob: torch.Tensor,
    inputs: LossInputs,
    beta: float,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """[num_groups] stop-gradient VarGrad estimate log Z_g = -(weighted) mean_g delta."""
    delta = tb_delta(policy_logprob.detach(), inputs, beta)
    return -group_mean(delta, inputs.group_index, inputs.num_groups, weights)


def kl_shaped_reward(policy_logprob: torch.Tensor, inputs: LossInputs, beta: float) -> torch.Tensor:
    """r~ = r - beta (log pi_theta - log pi_ref), stop-gradient."""
    return inputs.reward - beta * (policy_logprob.detach() - inputs.ref_logprob)


def rloo_advantages(policy_logprob: torch.Tensor, inputs: LossInputs, beta: float) -> torch.Tensor:
    """A_j = r~_j - mean of r~ over the other members of j's group (0 alone in its group)."""
    shaped = kl_shaped_reward(policy_logprob, inputs, beta)
    sums = group_sum(shaped, inputs.group_index, inputs.num_groups)[inputs.group_index]
    counts = group_sum(torch.ones_like(shaped), inputs.group_index, inputs.num_groups)
    others = counts[inputs.group_index] - 1
    baseline = (sums - shaped) / others.clamp(min=1)
    return torch.where(others > 0, shaped - baseline, torch.zeros_like(shaped))


class Objective(Protocol):
    """A loss split into group-wide constants and per-trajectory terms (see module doc)."""

    def baselines(
        self, policy_logprob: torch.Tensor, inputs: LossInputs, beta: float
    ) -> torch.Tensor:
        """[n] stop-gradient constants that need the whole group."""
        ...

    def terms(
        self,
        policy_logprob: torch.Tensor,
        inputs: LossInputs,
        beta: float,
        baselines: torch.Tensor,
    ) -> torch.Tensor:
        """[n] per-trajectory loss terms; the loss is their sum over N trajectories."""
        ...


@dataclass(frozen=True)
class TrajectoryBalance:
    clip: ImportanceClip | None = None

    def baselines(
        self, policy_logprob: torch.Tensor, inputs: LossInputs, beta: float
    ) -> torch.Tensor:
        weights = trajectory_weights(policy_logprob, inputs, self.clip)
        return tb_log_z(policy_logprob, inputs, beta, weights)[inputs.group_index]

    def terms(
        self,
        policy_logprob: torch.Tensor,
        inputs: LossInputs,
        beta: float,
        baselines: torch.Tensor,
    ) -> torch.Tensor:
        weights = trajectory_weights(policy_logprob, inputs, self.clip)
        return weights * (baselines + tb_delta(policy_logprob, inputs, beta)) ** 2


@dataclass(frozen=True)
class Rloo:
    clip: ImportanceClip | None = None

    def baselines(
        self, policy_logprob: torch.Tensor, inputs: LossInputs, beta: float
    ) -> torch.Tensor:
        return rloo_advantages(policy_logprob, inputs, beta)

    def terms(
        self,
        policy_logprob: torch.Tensor,
        inputs: LossInputs,
        beta: float,
        baselines: torch.Tensor,
    ) -> torch.Tensor:
        weights = trajectory_weights(policy_logprob, inputs, self.clip)
        return -weights * baselines * policy_logprob
