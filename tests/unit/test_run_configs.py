"""Every run file in configs/ validates against the sections of all `tba` commands, each
command resolves its settings from it, and the paper's settings are the ones the files hold."""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path
from typing import Any

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
    expected += ["gsm8k-rhomath-1b-figure1"]  # Figure 1's run, a variant of Table 2's
    expected += ["redteam-gpt2-large"]  # App. B.3's large scale, a variant of its small one
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


TABLE_2 = {
    "model.dtype": "bf16",
    "task.gsm8k.template": "[MATH TASK] Problem:\n{question}\n\nSolution:\n",
    "trainer.steps": 1000,
    "trainer.num_prompts": 7,
    "trainer.samples_per_prompt": 20,
    "trainer.min_batch_prompts": 7,
    "trainer.initial_buffer_completions": 500,
    "trainer.recency_probability": 0.95,
    "trainer.reward_temperature": None,  # uniform
    "trainer.publish_every_steps": 2,
    "trainer.beta_start": 0.012,
    "trainer.beta_end": 0.004,
    "trainer.beta_anneal_steps": 500,
    "trainer.beta_cut_step": 500,
    "optim.lr": 1e-5,
    "optim.schedule": "wsd",
    "optim.warmup_steps": 50,
    "optim.decay_steps": 500,  # after 1,000 - 50 - 500 = 450 stable steps
    "searcher.samples_per_prompt": 24,
    "searcher.temperature": 0.7,
    "searcher.max_new_tokens": 512,
    "searcher.max_prompt_tokens": 512,
}
APPENDIX_B3 = {
    "buffer.capacity": 100_000,
    "buffer.freeze_growth_after_step": 4000,
    "trainer.steps": 5000,
    "trainer.beta_start": 0.05,
    "trainer.beta_end": 0.05,
    "trainer.recency_probability": 0.5,
    "trainer.reward_temperature": 1.0,  # reward-prioritised
    "trainer.publish_every_steps": 10,
    "trainer.batch": 128,  # num_prompts x samples_per_prompt
    # The small setup's target: log pi_ref + r / beta, untempered.
    "trainer.target_temperature_start": 1.0,
    "trainer.target_temperature_end": 1.0,
    "trainer.prior_temperature_start": 1.0,
    "trainer.prior_temperature_end": 1.0,
    # The small setup samples every round at the run's temperature: no per-round range.
    "searcher.temperature_low": None,
    "searcher.temperature_high": None,
}
PAPER_TABLES = {
    "gsm8k-rhomath-1b": TABLE_2,
    "gsm8k-rhomath-1b-figure1": {**TABLE_2, "trainer.steps": 700, "trainer.beta_start": 0.014},
    "tldr-pythia": {
        "model.dtype": "fp32",
        "task.preference.unfinished_reward": -1.0,
        "trainer.steps": 256,
        "trainer.num_prompts": 8,
        "trainer.samples_per_prompt": 20,
        "trainer.initial_buffer_completions": 10_000,
        "trainer.recency_probability": 0.5,
        "trainer.reward_temperature": 1.0,  # softmax of reward, inverse temperature 1
        "trainer.publish_every_steps": 10,
        "trainer.beta_start": 1.0,
        "trainer.beta_end": 0.05,
        "trainer.beta_anneal_steps": 128,
        "trainer.beta_cut_step": 32,
        "optim.lr": 3e-6,
        "optim.schedule": "wsd",  # no warmup, decay over every step: linear decay
        "optim.warmup_steps": 0,
        "optim.decay_steps": 256,
        "searcher.samples_per_prompt": 20,
        "searcher.temperature": 0.7,
        "searcher.max_new_tokens": 128,
        "searcher.max_prompt_tokens": 512,
    },
    "redteam-gpt2": APPENDIX_B3,
    "redteam-gpt2-large": {
        **APPENDIX_B3,
        # The reward schedule: T 2 -> 1 over 1,000 steps (Lee et al.'s reward_sched_*).
        "trainer.target_temperature_start": 2.0,
        "trainer.target_temperature_end": 1.0,
        "trainer.target_temperature_anneal_steps": 1000,
        # The LM-prior schedule: gamma 1 -> 1.2 over 2,000 steps (their lm_sched_*).
        "trainer.prior_temperature_start": 1.0,
        "trainer.prior_temperature_end": 1.2,
        "trainer.prior_temperature_anneal_steps": 2000,
        # Each round's temperature drawn in [0.7, 2.0] (App. B.3; Lee et al.'s README,
        # --temp_low 0.7 --temp_high 2.0), on half of the rounds, the others at 1 (their
        # simulate_experience).
        "searcher.temperature": 1.0,
        "searcher.temperature_low": 0.7,
        "searcher.temperature_high": 2.0,
        "searcher.temperature_draw_fraction": 0.5,
    },
}


def printed_settings(path: Path) -> dict[str, Any]:
    """What `tba trainer run --config PATH --print-config` prints, and `[buffer]` as `tba
    buffer serve` prints it, flattened to dotted keys."""
    printed = tomllib.loads(load(path, ("trainer", "run")).to_toml())
    printed["buffer"] = tomllib.loads(load(path, ("buffer", "serve")).to_toml())["buffer"]
    flat: dict[str, Any] = {}

    def walk(prefix: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            else:
                flat[f"{prefix}{key}"] = value

    walk("", printed)
    flat["trainer.batch"] = flat["trainer.num_prompts"] * flat["trainer.samples_per_prompt"]
    return flat


@pytest.mark.parametrize("name", sorted(PAPER_TABLES))
def test_each_paper_file_prints_its_tables_values(name):
    printed = printed_settings(CONFIGS / f"{name}.toml")
    shown = {key: printed.get(key) for key in PAPER_TABLES[name]}
    assert shown == PAPER_TABLES[name]


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
