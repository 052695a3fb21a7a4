"""Per-token quantities of a step, from the policy's token log-probs and those the searchers
stored with each trajectory (`Trajectory.behavior_token_logprobs`, `ref_token_logprobs`).
Pure tensor functions; rows are lists of [tokens] tensors, an empty one where a trajectory
came without per-token log-probs (older searchers, `[searcher] token_logprobs = false`).

    kl_token_mean = sum over tokens of (log pi_theta(t) - log pi_ref(t)) / tokens

over the rows that carry reference tokens (every completion token weighs the same, so long
completions count more than in the per-sequence `trainer/kl`).

Token-level importance weights (`importance_clip_level = "token"`): a row's weight is the
mean over its tokens of clip(exp(log pi_theta(t) - log pi_behaviour(t)), min, max),
stop-gradient. The mean, not the product: the product of clipped ratios shrinks or grows
geometrically with the length (and unclipped it is the sequence ratio again); the mean stays
in [min, max] like the sequence-level weight it replaces, and TB's log Z is the mean of the
group weighted by these same weights, as at sequence level.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tba.trainer.loss import ImportanceClip


class MissingTokenLogprobsError(ValueError):
    """A batch lacks the per-token log-probs a setting needs."""


def token_kl_sums(
    policy: Sequence[torch.Tensor], ref: Sequence[torch.Tensor], mask: torch.Tensor
) -> torch.Tensor:
    """[2]: the sum of log pi_theta - log pi_ref over the tokens of rows that carry reference
    tokens (and a mask of 1), and how many tokens that is."""
    kl = torch.zeros(())
    tokens = 0
    for logp, ref_row, weight in zip(policy, ref, mask.tolist(), strict=True):
        if ref_row.numel() and weight:
            kl = kl + (logp.detach().float() - ref_row).sum()
            tokens += ref_row.numel()
    return torch.stack([kl, torch.tensor(float(tokens))])


def token_importance_weights(
    policy: Sequence[torch.Tensor], behavior: Sequence[torch.Tensor], clip: ImportanceClip
) -> torch.Tensor:
    """[n] stop-gradient weights: per row, the mean of its clipped per-token ratios."""
    weights = [
        torch.exp(logp.detach().float() - behavior_row)
        .clamp(min=clip.min_weight, max=clip.max_weight)
        .mean()
        for logp, behavior_row in zip(policy, behavior, strict=True)
    ]
    return torch.stack(weights)


def require_behavior_tokens(
    behavior: Sequence[torch.Tensor], completions: Sequence[Sequence[int]]
) -> None:
    """Refuses a batch with a row whose behaviour tokens are missing (or do not fit)."""
    for row, (tokens, completion) in enumerate(zip(behavior, completions, strict=True)):
        if tokens.numel() != len(completion):
            raise MissingTokenLogprobsError(
                f'importance_clip_level = "token" needs per-token behaviour log-probs, and row '
                f"{row} of this batch has {tokens.numel()} for {len(completion)} tokens: its "
                "searcher sent none (an older searcher, or [searcher] token_logprobs = false). "
                'Turn token_logprobs on in every searcher or use "sequence".'
            )
