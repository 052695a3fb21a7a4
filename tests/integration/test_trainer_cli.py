"""`tba trainer run` in a subprocess: what it prints and what it refuses."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from tba.settings import load_settings
from tba.trainer.config import TrainerRunSettings


def test_print_config_lists_every_trainer_section():
    out = subprocess.run(
        [sys.executable, "-m", "tba", "trainer", "run", "--steps", "12", "--print-config"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sections = ("trainer", "model", "optim", "checkpoint", "metrics", "distributed", "searcher")
    for section in (*sections, "task"):
        assert f"[{section}]" in out
    assert "steps = 12" in out


def test_a_deprecated_trainer_temperature_that_disagrees_is_refused(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[trainer]\ntemperature = 1.0\n[searcher]\ntemperature = 0.7\n")
    with pytest.raises(ValidationError, match=r"trainer\.temperature .* searcher\.temperature"):
        load_settings(TrainerRunSettings, config)
    done = subprocess.run(
        [sys.executable, "-m", "tba", "trainer", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "trainer.temperature" in done.stderr and "searcher.temperature" in done.stderr
