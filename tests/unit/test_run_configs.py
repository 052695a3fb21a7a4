"""Every run file in configs/ validates against the sections of all `tba` commands, each
command resolves its settings from it, and the paper's settings are the ones the files hold."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tba.cli import COMMANDS, run_sections
from tba.inputs import check_inputs
from tba.settings import load_settings, validate_run_file

CONFIGS = Path(__file__).parents[2] / "configs"
PAPER_SETUPS = ["gsm8k-rhomath-1b", "redteam-gpt2", "tldr-pythia"]
FILES = sorted(CONFIGS.glob("*.toml"))


@pytest.fixture(autouse=True)
def no_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("TBA_"):
            monkeypatch.delenv(name)


def load(path: Path, command: tuple[str, ...]):
    module = importlib.import_module(COMMANDS[command])
    return load_settings(module.SETTINGS, path, run_sections=run_sections())


def test_one_file_per_setup_and_a_cpu_variant_of_each_paper_setup():
    names = sorted(path.stem for path in FILES)
    expected = PAPER_SETUPS + [f"{setup}-cpu" for setup in PAPER_SETUPS] + ["arithmetic-demo"]
    assert names == sorted(expected)
    assert all(path.suffix == ".toml" for path in CONFIGS.rglob("*") if path.is_file())


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_each_file_validates_against_every_commands_sections(path):
    assert path.read_text().startswith("#"), f"{path}: start with a comment saying what it runs"
    data = validate_run_file(path, run_sections())
    assert {"model", "task", "trainer", "searcher"} <= set(data)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_each_command_resolves_its_settings_from_each_file(path, command):
    settings = load(path, command)
    assert settings.to_toml()
    module = importlib.import_module(COMMANDS[command])
    # A command takes its own sections only, and each one it has the file's values.
    assert set(type(settings).model_fields) == set(module.SETTINGS.sections())


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_trainer_and_searcher_agree_on_model_task_and_generation(path):
    trainer = load(path, ("trainer", "run"))
    searcher = load(path, ("searcher", "run"))
    assert trainer.model == searcher.model and trainer.task == searcher.task
    assert trainer.temperature == searcher.searcher.temperature
    assert trainer.trainer.temperature is None, "set only [searcher] temperature"
    assert searcher.searcher.samples_per_prompt >= trainer.trainer.samples_per_prompt


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*-cpu.toml")), ids=lambda p: p.stem)
def test_cpu_variants_use_tiny_models_and_local_data(path, monkeypatch):
    settings = load(path, ("local",))
    assert settings.model.source == "tiny"
    assert settings.engine.kind == "transformers" and settings.engine.device == "cpu"
    monkeypatch.chdir(CONFIGS.parent)  # a run file's paths are relative to the repository
    check_inputs(settings, str(path))


def test_the_paper_hyperparameters():
    gsm8k = load(CONFIGS / "gsm8k-rhomath-1b.toml", ("trainer", "run"))
    assert (gsm8k.trainer.num_prompts, gsm8k.trainer.samples_per_prompt) == (7, 20)
    assert (gsm8k.optim.lr, gsm8k.optim.schedule) == (1e-5, "wsd")
    assert (gsm8k.trainer.recency_probability, gsm8k.trainer.publish_every_steps) == (0.95, 2)
    assert (gsm8k.trainer.beta_start, gsm8k.trainer.beta_end) == (0.014, 0.004)
    assert (gsm8k.temperature, gsm8k.searcher.max_new_tokens) == (0.7, 512)
    assert gsm8k.searcher.samples_per_prompt == 24
    tldr = load(CONFIGS / "tldr-pythia.toml", ("trainer", "run"))
    assert (tldr.trainer.num_prompts, tldr.trainer.samples_per_prompt) == (8, 20)
    assert (tldr.optim.lr, tldr.trainer.recency_probability) == (3e-6, 0.5)
    assert tldr.trainer.publish_every_steps == 10 and tldr.trainer.reward_temperature
    assert tldr.searcher.max_new_tokens == 128
    redteam = load(CONFIGS / "redteam-gpt2.toml", ("trainer", "run"))
    assert (redteam.trainer.beta_start, redteam.trainer.beta_end) == (0.05, 0.05)
    assert (redteam.trainer.publish_every_steps, redteam.trainer.recency_probability) == (10, 0.5)
    assert load(CONFIGS / "redteam-gpt2.toml", ("buffer", "serve")).buffer.capacity == 100_000


def test_evaluation_reads_the_same_file_with_its_own_decoding():
    evaluation = load(CONFIGS / "gsm8k-rhomath-1b.toml", ("eval",))
    assert evaluation.model.source == "realtreetune/rho-1b-sft-GSM8K"
    assert (evaluation.eval.temperature, evaluation.task.name) == (0.0, "gsm8k")


def test_the_demo_file_is_tba_locals_defaults():
    local = importlib.import_module(COMMANDS[("local",)]).SETTINGS
    from_file = load(CONFIGS / "arithmetic-demo.toml", ("local",))
    assert from_file == load_settings(local)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_tba_local_reads_a_file_as_the_services_do(path):
    """`tba local` hands its children what the services would resolve from the same file,
    except what is per machine: its buffer's ports and its weights folder."""
    local = load(path, ("local",))
    services = {
        ("trainer", "run"): ("trainer", "optim", "model", "task", "searcher"),
        ("searcher", "run"): ("searcher", "engine", "model", "task"),
    }
    for command, sections in services.items():
        resolved = load(path, command)
        for section in sections:
            assert getattr(local, section) == getattr(resolved, section), (command, section)
    per_machine = {"grpc_port", "http_port"}
    buffer = load(path, ("buffer", "serve")).buffer
    assert local.buffer.model_dump(exclude=per_machine) == buffer.model_dump(exclude=per_machine)
