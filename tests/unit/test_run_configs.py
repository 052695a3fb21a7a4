"""Every named run config in configs/ loads into the settings of the command it is for (its
file name: trainer, searcher, eval, buffer), and the files of one setup agree."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tba.cli import COMMANDS
from tba.settings import load_settings

CONFIGS = Path(__file__).parents[2] / "configs"
COMMAND_OF_FILE = {
    "buffer": ("buffer", "serve"),
    "trainer": ("trainer", "run"),
    "searcher": ("searcher", "run"),
    "eval": ("eval",),
}
FILES = sorted(CONFIGS.glob("*/*.toml"))
SETUPS = sorted(path.name for path in CONFIGS.iterdir() if path.is_dir())


@pytest.fixture(autouse=True)
def no_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("TBA_"):
            monkeypatch.delenv(name)


def load(path: Path):
    module = importlib.import_module(COMMANDS[COMMAND_OF_FILE[path.stem]])
    return load_settings(module.SETTINGS, path)


def test_the_paper_setups_are_there():
    assert SETUPS == ["gsm8k-rhomath-1b", "redteam-gpt2", "tldr-pythia"]
    assert all(path.suffix == ".toml" for path in CONFIGS.rglob("*") if path.is_file())


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_file_loads_into_its_command(path):
    assert path.stem in COMMAND_OF_FILE, f"{path}: name it after its command"
    text = path.read_text()
    assert text.startswith("#"), f"{path}: start with a comment saying what it runs"
    settings = load(path)
    assert settings.to_toml()


@pytest.mark.parametrize("setup", SETUPS)
def test_a_setups_files_agree(setup):
    trainer = load(CONFIGS / setup / "trainer.toml")
    searcher = load(CONFIGS / setup / "searcher.toml")
    evaluation = load(CONFIGS / setup / "eval.toml")
    # Log-probs on both sides use logits / the sampling temperature.
    assert trainer.trainer.temperature == searcher.searcher.temperature
    assert searcher.searcher.samples_per_prompt >= trainer.trainer.samples_per_prompt
    assert trainer.model.source == searcher.model.source == evaluation.model.source
    assert searcher.task.name == evaluation.task.name
    assert (
        getattr(searcher.task, searcher.task.name).source
        == getattr(evaluation.task, evaluation.task.name).source
    )


def test_the_paper_hyperparameters():
    gsm8k = load(CONFIGS / "gsm8k-rhomath-1b" / "trainer.toml")
    assert (gsm8k.trainer.num_prompts, gsm8k.trainer.samples_per_prompt) == (7, 20)
    assert (gsm8k.optim.lr, gsm8k.optim.schedule) == (1e-5, "wsd")
    assert (gsm8k.trainer.recency_probability, gsm8k.trainer.publish_every_steps) == (0.95, 2)
    assert (gsm8k.trainer.beta_start, gsm8k.trainer.beta_end) == (0.014, 0.004)
    gsm8k_searcher = load(CONFIGS / "gsm8k-rhomath-1b" / "searcher.toml")
    assert gsm8k_searcher.searcher.samples_per_prompt == 24
    assert gsm8k_searcher.searcher.max_new_tokens == 512
    tldr = load(CONFIGS / "tldr-pythia" / "trainer.toml")
    assert (tldr.trainer.num_prompts, tldr.trainer.samples_per_prompt) == (8, 20)
    assert (tldr.optim.lr, tldr.trainer.recency_probability) == (3e-6, 0.5)
    assert tldr.trainer.publish_every_steps == 10 and tldr.trainer.reward_temperature
    assert load(CONFIGS / "tldr-pythia" / "searcher.toml").searcher.max_new_tokens == 128
    redteam = load(CONFIGS / "redteam-gpt2" / "trainer.toml")
    assert (redteam.trainer.beta_start, redteam.trainer.beta_end) == (0.05, 0.05)
    assert (redteam.trainer.publish_every_steps, redteam.trainer.recency_probability) == (10, 0.5)
    assert load(CONFIGS / "redteam-gpt2" / "buffer.toml").buffer.capacity == 100_000
