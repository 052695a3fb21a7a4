"""Per-token quantities of a step against hand-computed values: the token-level KL, token-level
importance weights (the mean of clipped per-token ratios) and TB weighted by them, and the
refusal of a batch without per-token behaviour log-probs."""

from __future__ import annotations

import pydantic
import pytest
import torch

from tba.trainer.config import TrainerSettings
from tba.trainer.loss import ImportanceClip, LossInputs, TrajectoryBalance, trajectory_weights
from tba.trainer.tokens import (
    MissingTokenLogprobsError,
    require_behavior_tokens,
    token_importance_weights,
    token_kl_sums,
)

CLIP = ImportanceClip(0.5, 1.5, "token")
FIELDS = ("ref_logprob", "behavior_logprob", "reward", "group_index", "num_groups")


def test_token_kl_sums_count_the_tokens_of_rows_with_reference_tokens_only():
    policy = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5]), torch.tensor([-3.0, -1.0])]
    ref = [torch.tensor([-1.5, -2.5]), torch.zeros(0), torch.tensor([-2.0, -2.0])]
    # Row 0: 0.5 + 0.5; row 1 has none; row 2: -1 + 1. Masked, row 2 drops out.
    assert token_kl_sums(policy, ref, torch.ones(3)).tolist() == [1.0, 4.0]
    assert token_kl_sums(policy, ref, torch.tensor([1.0, 1.0, 0.0])).tolist() == [1.0, 2.0]


def test_token_weights_are_the_mean_of_clipped_token_ratios():
    behavior = [torch.zeros(2), torch.zeros(2), torch.zeros(1)]
    # Ratios: [2, 0.25] -> clipped [1.5, 0.5]; [1.2, 1.4]; [3] -> 1.5.
    policy = [torch.tensor(v).log() for v in ([2.0, 0.25], [1.2, 1.4], [3.0])]
    weights = token_importance_weights(policy, behavior, CLIP)
    assert weights.tolist() == pytest.approx([1.0, 1.3, 1.5])


def test_tb_weighs_rows_and_log_z_by_the_token_weights():
    # beta 1, rewards 0: delta = logp - ref = [-1, -2, 0]; weights [1, 1.3, 1.5].
    inputs = LossInputs(
        ref_logprob=torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64),
        behavior_logprob=torch.tensor([-9.0, -9.0, -9.0], dtype=torch.float64),  # unused
        reward=torch.zeros(3, dtype=torch.float64),
        group_index=torch.tensor([0, 0, 1]),
        num_groups=2,
        token_weight=torch.tensor([1.0, 1.3, 1.5], dtype=torch.float64),
    )
    logp = torch.tensor([-2.0, -3.0, -1.0], dtype=torch.float64)
    assert trajectory_weights(logp, inputs, CLIP).tolist() == [1.0, 1.3, 1.5]
    tb = TrajectoryBalance(CLIP)
    log_z = tb.baselines(logp, inputs, beta=1.0)
    # Group 0: log Z = -(1 * -1 + 1.3 * -2) / 2.3 = 3.6 / 2.3; group 1: 0.
    assert log_z.tolist() == pytest.approx([3.6 / 2.3, 3.6 / 2.3, 0.0])
    loss = tb.terms(logp, inputs, 1.0, log_z).sum() / 3
    expected = (1.0 * (3.6 / 2.3 - 1) ** 2 + 1.3 * (3.6 / 2.3 - 2) ** 2) / 3
    assert loss.item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="token_weight"):
        trajectory_weights(logp, LossInputs(*[getattr(inputs, f) for f in FIELDS]), CLIP)


def test_a_batch_without_behaviour_tokens_is_refused_naming_the_setting():
    completions = [[5, 6], [7]]
    require_behavior_tokens([torch.zeros(2), torch.zeros(1)], completions)
    with pytest.raises(MissingTokenLogprobsError, match=r"row 1 .* has 0 for 1 tokens"):
        require_behavior_tokens([torch.zeros(2), torch.zeros(0)], completions)


def test_token_level_clipping_needs_importance_weights_on_tb_or_rloo():
    assert TrainerSettings().importance_clip_level == "sequence"
    TrainerSettings(importance_weights=True, importance_clip_level="token")
    for bad in ({}, {"importance_weights": True, "objective": "grpo"}):
        with pytest.raises(pydantic.ValidationError, match="importance_clip_level"):
            TrainerSettings(importance_clip_level="token", **bad)
    with pytest.raises(pydantic.ValidationError):
        TrainerSettings(importance_clip_level="product")
