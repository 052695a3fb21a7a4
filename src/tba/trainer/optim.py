"""AdamW and learning-rate schedules: constant, cosine and warmup-stable-decay (WSD)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tba.trainer.config import OptimSettings


def lr_multiplier(step: int, settings: OptimSettings, total_steps: int) -> float:
    """Factor on the peak learning rate for the optimizer step after `step` steps (0-based).

    All schedules warm up linearly over `warmup_steps`. Then `constant` stays at 1; `cosine`
    falls to `min_lr_ratio` over `decay_steps` after the warmup (0: by `total_steps`) and
    stays there; `wsd` stays at 1 until the last `decay_steps` steps and falls linearly to
    `min_lr_ratio` over them.
    """
    warmup = settings.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    floor = settings.min_lr_ratio
    if settings.schedule == "cosine":
        span = max(settings.decay_steps or total_steps - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if settings.schedule == "wsd":
        decay = settings.decay_steps
        decay_start = total_steps - decay
        if decay <= 0 or step < decay_start:
            return 1.0
        progress = min((step - decay_start + 1) / decay, 1.0)
        return 1.0 + (floor - 1.0) * progress
    return 1.0


def build_optimizer(
    parameters: Iterable[torch.nn.Parameter], settings: OptimSettings
) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        [p for p in parameters if p.requires_grad],
        lr=settings.lr,
        betas=(settings.adam_beta1, settings.adam_beta2),
        eps=settings.adam_eps,
        weight_decay=settings.weight_decay,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, settings: OptimSettings, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, settings, total_steps)
    )
