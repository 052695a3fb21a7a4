"""What a searcher takes from the run and what it keeps: the fields its user set (by flag,
`TBA_*` variable or run file) are its own, every other one comes from the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tba.models.config import ModelSettings
from tba.runs import Run, RunIdentity, RunRecipe, canonical_json, prompt_template_sha256
from tba.searcher.config import SearcherRunSettings
from tba.searcher.joining import adopt_run, settings_identity
from tba.settings import load_settings
from tba.tasks.config import Gsm8kSettings, TaskSettings

RUN_TASK = TaskSettings(name="gsm8k", gsm8k=Gsm8kSettings(source="data/gsm8k", limit=8))
RUN_MODEL = ModelSettings(tiny_width=64)
RUN = Run(
    "r1",
    RunIdentity(temperature=0.3, max_new_tokens=9),
    RunRecipe(
        canonical_json(RUN_TASK.model_dump(mode="json")),
        canonical_json(RUN_MODEL.model_dump(mode="json")),
        5,
    ),
)


def test_defaults_are_not_explicit_and_come_from_the_run() -> None:
    adopted = adopt_run(load_settings(SearcherRunSettings), RUN)
    assert adopted.task == RUN_TASK and adopted.model == RUN_MODEL
    assert (adopted.searcher.temperature, adopted.searcher.max_new_tokens) == (0.3, 9)
    assert settings_identity(adopted) == RunIdentity(
        task_name="gsm8k",
        prompt_template_sha256=prompt_template_sha256(RUN_TASK),
        temperature=0.3,
        max_new_tokens=9,
    )


def test_what_flags_env_and_the_run_file_set_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[model]\ntiny_layers = 2\n\n[task.gsm8k]\nlimit = 4\n")
    monkeypatch.setenv("TBA_SEARCHER__TEMPERATURE", "0.5")
    settings = load_settings(
        SearcherRunSettings, config, {"searcher.max_new_tokens": 7, "engine.device": "cpu"}
    )
    assert settings.explicit("task") == {"gsm8k": {"limit": True}}
    assert settings.explicit("searcher") == {"temperature": True, "max_new_tokens": True}
    adopted = adopt_run(settings, RUN)
    assert adopted.task.name == "gsm8k" and adopted.task.gsm8k.source == "data/gsm8k"
    assert adopted.task.gsm8k.limit == 4
    assert (adopted.model.tiny_layers, adopted.model.tiny_width) == (2, 64)
    assert (adopted.searcher.temperature, adopted.searcher.max_new_tokens) == (0.5, 7)
    assert adopted.engine.device == "cpu"


def test_a_value_set_equal_to_its_default_is_still_explicit() -> None:
    settings = load_settings(SearcherRunSettings, None, {"searcher.temperature": 0.7})
    assert adopt_run(settings, RUN).searcher.temperature == 0.7
    assert settings_identity(adopt_run(settings, RUN)).temperature == 0.7


def test_the_runs_temperature_range_is_taken_unless_set_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranged = Run(
        "r1",
        RunIdentity(
            temperature=0.3,
            max_new_tokens=9,
            temperature_low=0.7,
            temperature_high=2.0,
            temperature_draw_fraction=0.25,
        ),
        RUN.recipe,
    )
    adopted = adopt_run(load_settings(SearcherRunSettings), ranged)
    assert adopted.searcher.temperature_range == (0.7, 2.0, 0.25)
    assert settings_identity(adopted).temperature_high == 2.0
    # A run without a range gives none, whatever the searcher's default fraction.
    assert adopt_run(load_settings(SearcherRunSettings), RUN).searcher.temperature_range is None
    monkeypatch.setenv("TBA_SEARCHER__TEMPERATURE_HIGH", "1.5")
    monkeypatch.setenv("TBA_SEARCHER__TEMPERATURE_LOW", "0.7")
    own = adopt_run(load_settings(SearcherRunSettings), ranged)
    assert own.searcher.temperature_range == (0.7, 1.5, 0.25)
    assert settings_identity(own).temperature_high == 1.5  # the buffer then refuses it


def test_a_range_needs_both_ends_in_order() -> None:
    with pytest.raises(ValueError, match="both"):
        load_settings(SearcherRunSettings, overrides={"searcher.temperature_low": 0.7})
    with pytest.raises(ValueError, match="above"):
        load_settings(
            SearcherRunSettings,
            overrides={"searcher.temperature_low": 2.0, "searcher.temperature_high": 0.7},
        )
