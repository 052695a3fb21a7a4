import math

import pytest
import torch

from tba.trainer.config import OptimSettings
from tba.trainer.optim import RewardDecay, build_optimizer, build_scheduler, lr_multiplier


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


def reward_decay_settings(**overrides: float) -> OptimSettings:
    fields = {"reward_decay_from": 0.5, "reward_decay_to": 0.9, "reward_average_steps": 2}
    fields.update(overrides)
    return OptimSettings(schedule="cosine", decay_by="reward", min_lr_ratio=0.2, **fields)


def test_reward_decay_places_the_running_mean_between_its_bounds():
    decay = RewardDecay(reward_decay_settings())
    decay.observe(0.5)  # the first mean starts the average: 0.5 -> progress 0
    assert decay.progress == pytest.approx(0.0)
    decay.observe(0.9)  # average 0.5 + (0.9 - 0.5) / 2 = 0.7 -> (0.7 - 0.5) / 0.4 = 0.5
    assert decay.state == pytest.approx({"reward_average": 0.7, "progress": 0.5})
    decay.observe(1.0)  # average 0.85 -> 0.875
    assert decay.progress == pytest.approx(0.875)
    decay.observe(1.0)  # average 0.925: past the upper bound, held at 1
    assert decay.progress == pytest.approx(1.0)


def test_reward_decay_never_goes_back():
    decay = RewardDecay(reward_decay_settings())
    decay.observe(0.8)  # average 0.8 -> 0.75
    decay.observe(0.0)  # average 0.4: below the lower bound, progress kept
    assert decay.state == pytest.approx({"reward_average": 0.4, "progress": 0.75})


def test_cosine_by_reward_follows_progress_not_steps():
    settings = reward_decay_settings()
    # Step 1,000 of 10: a step-keyed cosine would be at its floor; progress 0 keeps the peak.
    assert lr_multiplier(1000, settings, 10, reward_progress=0.0) == pytest.approx(1.0)
    assert lr_multiplier(3, settings, 10, reward_progress=0.5) == pytest.approx(0.2 + 0.8 * 0.5)
    assert lr_multiplier(3, settings, 10, reward_progress=1.0) == pytest.approx(0.2)


def test_scheduler_reads_the_reward_decay_at_each_step():
    settings = reward_decay_settings(lr=0.01)
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = build_optimizer([weight], settings)
    decay = RewardDecay(settings)
    scheduler = build_scheduler(optimizer, settings, total_steps=3, reward_decay=decay)
    seen = []
    for reward in (0.5, 0.9, 1.0):
        seen.append(optimizer.param_groups[0]["lr"])
        decay.observe(reward)
        weight.grad = torch.ones(1)
        optimizer.step()
        scheduler.step()
    seen.append(optimizer.param_groups[0]["lr"])
    # progress 0, 0, 0.5, 0.875 before each step
    cosine = 0.5 * (1 + math.cos(math.pi * 0.875))
    assert seen == pytest.approx([0.01, 0.01, 0.01 * 0.6, 0.01 * (0.2 + 0.8 * cosine)])


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"schedule": "constant", "decay_by": "reward"}, "needs schedule = cosine"),
        (
            {"schedule": "cosine", "decay_by": "reward", "reward_decay_from": 0.9},
            "reward_decay_from must be below",
        ),
    ],
)
def test_reward_decay_settings_are_checked(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OptimSettings.model_validate(fields)
