import json

from tba.domain import Prompt
from tba.local.bootstrap import bootstrap_base_model
from tba.local.config import BootstrapSettings
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.config import ArithmeticSettings

SMALL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "batch_size": 8, "validation_prompts": 20}


class AlwaysRight(ArithmeticTask):
    """Scores every completion 1, so the first validation check reaches any target."""

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        return 1.0


def small_task() -> ArithmeticTask:
    return ArithmeticTask(ArithmeticSettings(min_operand=10, max_operand=20, test_size=20))


def test_bootstrap_trains_all_steps_without_a_target_and_caches(tmp_path):
    settings = BootstrapSettings(steps=3, target_accuracy=0.0, **SMALL)
    first = bootstrap_base_model(tmp_path, settings, small_task())
    info = json.loads((first / "bootstrap.json").read_text())
    assert info["steps"] == 3
    assert (first / "model.safetensors").exists()
    modified = (first / "model.safetensors").stat().st_mtime_ns
    again = bootstrap_base_model(tmp_path, settings, small_task())
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == modified


def test_bootstrap_stops_at_the_first_check_that_reaches_the_target(tmp_path):
    settings = BootstrapSettings(steps=50, target_accuracy=0.9, check_every_steps=4, **SMALL)
    base = bootstrap_base_model(tmp_path, settings, AlwaysRight())
    info = json.loads((base / "bootstrap.json").read_text())
    assert info["steps"] == 4 and info["validation_accuracy"] == 1.0


def test_bootstrap_stops_at_steps_when_the_target_is_not_reached(tmp_path):
    settings = BootstrapSettings(steps=2, target_accuracy=0.99, check_every_steps=1, **SMALL)
    base = bootstrap_base_model(tmp_path, settings, small_task())
    info = json.loads((base / "bootstrap.json").read_text())
    assert info["steps"] == 2 and 0.0 <= info["validation_accuracy"] < 0.99
