import pytest
from pydantic import ValidationError

from tba.domain import WeightVersion
from tba.local.config import LocalRunSettings
from tba.settings import load_settings
from tba.trainer.config import TrainerRunSettings, TrainerSettings
from tba.trainer.loop import target_temperatures
from tba.trainer.loss import Rloo, TrajectoryBalance
from tba.trainer.main import build_objective, next_base_version


def test_defaults_follow_the_paper_gsm8k_settings():
    settings = load_settings(TrainerRunSettings)
    t = settings.trainer
    assert (t.num_prompts, t.samples_per_prompt, t.recency_probability) == (7, 20, 0.95)
    assert (t.beta_start, t.beta_end, t.beta_anneal_steps) == (0.014, 0.004, 500)
    assert t.beta_cut_step == 0 and t.initial_buffer_completions == 0  # no cut, no wait
    assert t.publish_every_steps == 2 and t.objective == "tb"
    assert settings.objectstore.uri.startswith("file://")


def test_env_and_overrides(monkeypatch):
    monkeypatch.setenv("TBA_TRAINER__PUBLISH_EVERY_STEPS", "10")
    monkeypatch.setenv("TBA_OPTIM__SCHEDULE", "wsd")
    settings = load_settings(TrainerRunSettings, overrides={"trainer.objective": "rloo"})
    assert settings.trainer.publish_every_steps == 10
    assert settings.optim.schedule == "wsd"
    assert isinstance(build_objective(settings.trainer), Rloo)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("trainer.beta_start", "0"),
        ("trainer.recency_probability", "1.5"),
        ("trainer.objective", "dpo"),
        ("optim.schedule", "linear"),
        ("distributed.zero_stage", "4"),
    ],
)
def test_out_of_bounds_values_are_errors(key, value):
    with pytest.raises(ValidationError, match=key.split(".")[1]):
        load_settings(TrainerRunSettings, overrides={key: value})


def test_importance_clip_must_be_an_interval():
    with pytest.raises(ValidationError, match="importance_weight_min"):
        load_settings(
            TrainerRunSettings,
            overrides={"trainer.importance_weight_min": "3", "trainer.importance_weight_max": "2"},
        )


def test_reference_resets_are_refused_under_zero3():
    overrides = {
        "distributed.backend": "deepspeed",
        "distributed.zero_stage": "3",
        "trainer.reference_reset_steps": "5",
    }
    with pytest.raises(ValidationError, match="ZeRO-3"):
        load_settings(TrainerRunSettings, overrides=overrides)


def test_importance_weights_switch_on_the_clip():
    settings = load_settings(TrainerRunSettings, overrides={"trainer.importance_weights": "true"})
    objective = build_objective(settings.trainer)
    assert isinstance(objective, TrajectoryBalance) and objective.clip is not None
    assert objective.clip.max_weight == 2.0


def test_next_version_comes_after_every_record():
    buffer = WeightVersion(7, "file:///w/versions/v7", "a" * 64, 14, 0.0)
    store = WeightVersion(8, "file:///w/versions/v8", "b" * 64, 16, 0.0)
    assert next_base_version(5, buffer, store) == 8
    assert next_base_version(9, buffer, None) == 9
    assert next_base_version(0, None, None) == 0


def test_the_sampling_temperature_is_the_searchers():
    settings = load_settings(TrainerRunSettings, overrides={"searcher.temperature": "1.3"})
    assert settings.temperature == 1.3
    assert settings.trainer.temperature is None


def test_the_deprecated_trainer_temperature_is_accepted_when_it_agrees():
    overrides = {"trainer.temperature": "1.3", "searcher.temperature": "1.3"}
    assert load_settings(TrainerRunSettings, overrides=overrides).temperature == 1.3
    # The paper configs of earlier versions set 0.7, the searchers' default.
    assert load_settings(TrainerRunSettings, overrides={"trainer.temperature": "0.7"})


@pytest.mark.parametrize("objective", ["rloo", "grpo", "online_dpo"])
def test_completions_chosen_by_reward_are_for_tb_alone(objective):
    chosen = {"searcher.samples_per_prompt": "16", "searcher.post_per_prompt": "8"}
    with pytest.raises(ValidationError, match=f"biases objective '{objective}'"):
        load_settings(TrainerRunSettings, overrides={**chosen, "trainer.objective": objective})
    assert load_settings(TrainerRunSettings, overrides=chosen).searcher.post_per_prompt == 8
    every = {"searcher.samples_per_prompt": "16", "trainer.objective": objective}
    assert load_settings(TrainerRunSettings, overrides=every).trainer.objective == objective


def test_tba_local_refuses_its_demo_choice_with_another_objective_before_starting():
    with pytest.raises(ValidationError, match="biases objective 'rloo'"):
        load_settings(LocalRunSettings, overrides={"trainer.objective": "rloo"})
    overrides = {"trainer.objective": "rloo", "searcher.post_per_prompt": "0"}
    assert load_settings(LocalRunSettings, overrides=overrides).searcher.samples_per_prompt == 16


def test_the_trainer_reads_the_runs_task():
    settings = load_settings(TrainerRunSettings, overrides={"task.name": "gsm8k"})
    assert settings.task.name == "gsm8k"


def test_a_batch_cannot_need_more_groups_than_it_draws():
    with pytest.raises(ValidationError, match="min_batch_prompts must be at most num_prompts"):
        load_settings(
            TrainerRunSettings,
            overrides={"trainer.num_prompts": "2", "trainer.min_batch_prompts": "3"},
        )


def test_prior_and_target_temperatures_follow_their_schedules():
    t = TrainerSettings(
        prior_temperature_end=1.2,
        prior_temperature_anneal_steps=2000,
        target_temperature_start=2.0,
        target_temperature_anneal_steps=1000,
    )
    assert target_temperatures(t, 0) == (1.0, 2.0)
    assert target_temperatures(t, 500) == pytest.approx((1.05, 1.5))
    assert target_temperatures(t, 3000) == pytest.approx((1.2, 1.0))
    assert target_temperatures(TrainerSettings(), 123) == (1.0, 1.0)


def test_temperatures_of_the_target_are_tbs_alone():
    with pytest.raises(ValidationError, match="objective = tb"):
        TrainerSettings(objective="rloo", target_temperature_start=2.0)
    assert TrainerSettings(objective="grpo").objective == "grpo"
