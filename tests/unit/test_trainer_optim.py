import math

import pytest
import torch

from tba.trainer.config import OptimSettings
from tba.trainer.optim import build_optimizer, build_scheduler, lr_multiplier


def multipliers(settings: OptimSettings, total: int) -> list[float]:
    return [lr_multiplier(step, settings, total) for step in range(total)]


def test_constant_with_warmup():
    settings = OptimSettings(schedule="constant", warmup_steps=4)
    assert multipliers(settings, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_warmup_stable_decay():
    settings = OptimSettings(schedule="wsd", warmup_steps=2, decay_steps=4, min_lr_ratio=0.2)
    # warmup 0.5, 1 | stable 1, 1 | decay over the last 4 steps to 0.2
    expected = [0.5, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2]
    assert multipliers(settings, 8) == pytest.approx(expected)


def test_cosine_reaches_the_floor_at_the_end():
    settings = OptimSettings(schedule="cosine", warmup_steps=1, min_lr_ratio=0.1)
    values = multipliers(settings, 5)
    assert values[0] == pytest.approx(1.0)  # one warmup step reaches the peak
    assert values[1] == pytest.approx(1.0)
    assert values[3] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(5, settings, 5) == pytest.approx(0.1)


def test_cosine_with_decay_steps_reaches_the_floor_early_and_stays():
    settings = OptimSettings(schedule="cosine", decay_steps=2, min_lr_ratio=0.25)
    # 1 | halfway: 0.25 + 0.75 * 0.5 | floor from step 2 on
    assert multipliers(settings, 6) == pytest.approx([1.0, 0.625, 0.25, 0.25, 0.25, 0.25])


def test_scheduler_drives_the_optimizer_learning_rate():
    settings = OptimSettings(lr=0.01, schedule="wsd", warmup_steps=2, decay_steps=2)
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = build_optimizer([weight], settings)
    scheduler = build_scheduler(optimizer, settings, total_steps=5)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.ones(1)
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.005, 0.01, 0.01, 0.005, 0.0])
