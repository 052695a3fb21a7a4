"""wandb's settings in the trainer's `[metrics]` and the searcher's `[searcher]`: where they
come from, what is refused, and the config a wandb run gets (no secrets)."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr, ValidationError

from tba.buffer.config import BufferClientSettings
from tba.cli import run_sections
from tba.objectstore.config import ObjectStoreSettings
from tba.searcher.config import SearcherRunSettings, SearcherSettings
from tba.settings import RunFileError, load_settings
from tba.trainer.config import MetricsSettings, TrainerRunSettings
from tba.wandb_sink import public_config


def test_off_unless_a_project_is_set_and_not_disabled():
    assert not MetricsSettings().wandb_on
    assert MetricsSettings(wandb_project="tba").wandb_on
    assert not MetricsSettings(wandb_project="tba", wandb_mode="disabled").wandb_on
    assert SearcherSettings(wandb_project="tba", wandb_mode="offline").wandb_on


def test_environment_variables_set_the_trainers_and_the_searchers(monkeypatch):
    monkeypatch.setenv("TBA_METRICS__WANDB_PROJECT", "tba-runs")
    monkeypatch.setenv("TBA_METRICS__WANDB_MODE", "offline")
    monkeypatch.setenv("TBA_SEARCHER__WANDB_PROJECT", "tba-search")
    monkeypatch.setenv("TBA_SEARCHER__WANDB_ENTITY", "team")
    trainer = load_settings(TrainerRunSettings)
    assert (trainer.metrics.wandb_project, trainer.metrics.wandb_mode) == ("tba-runs", "offline")
    searcher = load_settings(SearcherRunSettings)
    assert (searcher.searcher.wandb_project, searcher.searcher.wandb_entity) == (
        "tba-search",
        "team",
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("metrics.wandb_mode", "cloud", "'online', 'offline' or 'disabled'"),
        ("metrics.wandb_project", "a/b", "should match pattern"),
        ("metrics.wandb_project", "", "at least 1 character"),
        ("metrics.wandb_entity", "x" * 129, "at most 128 characters"),
    ],
)
def test_bad_values_are_errors_naming_the_field(key, value, message):
    with pytest.raises(ValidationError) as caught:
        load_settings(TrainerRunSettings, overrides={key: value})
    assert key.split(".")[1] in str(caught.value) and message in str(caught.value)


def test_a_bad_mode_in_a_run_file_names_the_section_and_field(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[searcher]\nwandb_project = 'tba'\nwandb_mode = 'cloud'\n")
    with pytest.raises(RunFileError) as caught:
        load_settings(SearcherRunSettings, config, run_sections=run_sections())
    assert f"{config}: [searcher] wandb_mode: Input should be 'online'" in str(caught.value)


def test_the_runs_config_holds_every_section_and_no_secret():
    settings = TrainerRunSettings(
        client=BufferClientSettings(auth_token=SecretStr("token-0123456789abcdef")),
        objectstore=ObjectStoreSettings(
            access_key_id=SecretStr("AKIA-id"), secret_access_key=SecretStr("s3-secret")
        ),
    )
    config = public_config(settings)
    assert config["trainer"]["steps"] == settings.trainer.steps
    assert config["searcher"]["temperature"] == settings.searcher.temperature
    assert "auth_token" not in config["client"] and config["client"]["address"]
    assert "access_key_id" not in config["objectstore"]
    assert "secret_access_key" not in config["objectstore"]
    shown = json.dumps(config)
    assert "0123456789abcdef" not in shown and "AKIA" not in shown and "s3-secret" not in shown
