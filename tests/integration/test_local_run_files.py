"""`tba local --config FILE` runs each CPU-sized run file of configs/ and the arithmetic demo on
this machine: a few trainer steps, every service on the file's model and task."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from tba.trainer.config import TrainerSettings
from tba.trainer.loop import target_temperatures
from tba.trainer.loss import beta_at
from tests.fixtures.local_run import run_local

REPO = Path(__file__).parents[2]
RUN_FILES = ["gsm8k-rhomath-1b-cpu", "tldr-pythia-cpu", "redteam-gpt2-cpu", "arithmetic-demo"]
STEPS = 3


@pytest.mark.parametrize("name", RUN_FILES)
def test_tba_local_runs_the_run_file(tmp_path, monkeypatch, name):
    monkeypatch.chdir(REPO)  # the files' data paths are relative to the repository
    config = REPO / "configs" / f"{name}.toml"
    result = run_local(
        tmp_path / "run",
        *("--config", str(config), "--steps", str(STEPS)),
        *("--set", "local.eval_prompts=8"),
    )
    assert result.summary["steps"] == STEPS
    task = tomllib.loads(config.read_text())["task"]["name"]
    assert f"task {task}" in result.log("searcher-0")
    trainer = tomllib.loads((result.run_dir / "trainer.toml").read_text())
    searcher = tomllib.loads((result.run_dir / "searcher-0" / "searcher.toml").read_text())
    assert trainer["model"]["source"] == searcher["model"]["source"]
    assert trainer["task"] == searcher["task"]
    assert trainer["searcher"]["temperature"] == searcher["searcher"]["temperature"]
    run_file = tomllib.loads(config.read_text())
    check_fill_and_beta(result.run_dir, TrainerSettings(**run_file["trainer"]))
    freeze_step = run_file.get("buffer", {}).get("freeze_growth_after_step", 0)
    if freeze_step:  # the red-teaming variant freezes at step 2 of 3
        assert f"trainer step {freeze_step}: buffer growth frozen at" in result.log("buffer")
    check_round_temperatures(result.log("searcher-0"), run_file["searcher"])


def check_round_temperatures(searcher_log: str, searcher: dict[str, float]) -> None:
    """With a per-round range, the searcher's rounds (its log) sampled at more than one
    temperature, each the run's or one in the range."""
    if "temperature_low" not in searcher:
        return
    shown = re.findall(r"searcher/temperature=([0-9.]+)", searcher_log)
    temperatures = {float(t) for t in shown}
    assert len(temperatures) > 1, shown
    low, high = searcher["temperature_low"], searcher["temperature_high"]
    # The log shows 4 significant digits.
    assert all(t == searcher["temperature"] or low - 1e-3 <= t <= high + 1e-3 for t in temperatures)


def check_fill_and_beta(run_dir: Path, t: TrainerSettings) -> None:
    """The file's initial fill came first (a row at step 0), then each step's beta is the
    schedule's, through its cut (the TL;DR variant cuts at step 2), and so are its prior
    and target temperatures."""
    lines = (run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    if t.initial_buffer_completions:
        fill, rows = rows[0], rows[1:]
        assert fill["step"] == 0
        assert fill["trainer/initial_fill_completions"] >= t.initial_buffer_completions
    schedule = (t.beta_start, t.beta_end, t.beta_anneal_steps, t.beta_cut_step)
    assert [r["trainer/beta"] for r in rows] == pytest.approx(
        [beta_at(r["step"] - 1, *schedule) for r in rows]
    )
    # The target's temperatures too (the red-teaming variant anneals both).
    temperatures = [(r["trainer/prior_temperature"], r["trainer/target_temperature"]) for r in rows]
    assert temperatures == [pytest.approx(target_temperatures(t, r["step"] - 1)) for r in rows]


# The comparison objectives and token-level importance clipping, end to end on the demo's run
# file (TB with importance weights), so every trainer mechanism runs on the real data path.
# The others train on every completion generated: the demo's choice by reward is TB's alone.
EVERY_COMPLETION = ("--set", "searcher.samples_per_prompt=8", "--set", "searcher.post_per_prompt=0")
VARIANTS = {
    "grpo": ("--objective", "grpo", *EVERY_COMPLETION),
    "online_dpo": ("--objective", "online_dpo", *EVERY_COMPLETION),
    "token_clip": ("--set", "trainer.importance_clip_level=token"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tba_local_trains_each_objective_and_the_token_clip(tmp_path, monkeypatch, variant):
    monkeypatch.chdir(REPO)
    config = REPO / "configs" / "arithmetic-demo.toml"
    result = run_local(
        tmp_path / "run",
        *("--config", str(config), "--steps", str(STEPS), *VARIANTS[variant]),
        *("--set", "local.eval_prompts=8"),
    )
    assert result.summary["steps"] == STEPS
    trainer = tomllib.loads((result.run_dir / "trainer.toml").read_text())["trainer"]
    if variant == "token_clip":
        assert trainer["importance_clip_level"] == "token"
    else:
        assert trainer["objective"] == variant
    lines = (result.run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # The searchers send per-token log-probs by default: the token-level KL is measured.
    assert all(r["trainer/kl_token_mean"] == r["trainer/kl_token_mean"] for r in rows)
