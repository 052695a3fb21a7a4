"""`tba eval` end to end on tiny models built from configs: pass@1 for math tasks, win rate
and perplexity for preference, attack success rate and diversity for red-teaming; the JSON
report agrees with its own samples and with the models read directly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tba.cli import main
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split
from tba.tasks.config import ArithmeticSettings, Gsm8kSettings
from tba.tasks.diversity import mean_pairwise_cosine_distance, normalised_text
from tba.tasks.embedding import load_embedder
from tba.tasks.gsm8k import Gsm8kTask
from tests.fixtures.tiny_models import save_causal_lm, save_classifier, save_embedder, write_jsonl

SHARED_GSM8K = Path(__file__).parents[2].parent / "shared" / "data" / "gsm8k"
TINY = ["--set", "model.tiny_layers=1", "--set", "model.tiny_width=32", "--set", "eval.device=cpu"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval-models")
    return {
        "policy": save_causal_lm(root / "policy", seed=11),
        "rm": save_classifier(root / "rm", seed=12),
        "gold": save_classifier(root / "gold", seed=13),
        "victim": save_causal_lm(root / "victim", seed=14),
        "classifier": save_classifier(root / "classifier", labels=["ok", "toxic"], seed=15),
    }


def run_eval(tmp_path: Path, *args: str) -> dict[str, Any]:
    output = tmp_path / "report.json"
    main(["eval", "--output", str(output), *args])
    return json.loads(output.read_text())


def test_arithmetic_pass_at_1(tmp_path, capsys):
    report = run_eval(
        tmp_path,
        *("--task", "arithmetic", "--model", "tiny", "--limit", "4", *TINY),
        *("--set", "task.arithmetic.test_size=10", "--set", "eval.max_new_tokens=4"),
    )
    samples = report["samples"]
    assert report["task"] == "arithmetic" and report["prompts"] == 4 and len(samples) == 4
    task = ArithmeticTask(ArithmeticSettings(test_size=10))
    prompts = task.prompts(Split.TEST)[:4]
    expected = [task.reward(p, s["completion"]) for p, s in zip(prompts, samples, strict=True)]
    assert [s["reward"] for s in samples] == expected
    assert report["metrics"]["eval/pass@1"] == sum(expected) / 4
    # Greedy: diversity is of eval.diversity_samples (4) completions sampled per prompt.
    assert report["metrics"]["eval/diversity_samples"] == 16
    assert 0.25 <= report["metrics"]["eval/distinct_answer_ratio"] <= 1.0
    assert 0.0 <= report["metrics"]["eval/pairwise_distance"] <= 1.0
    printed = capsys.readouterr().out
    assert "eval/pass@1" in printed and "report written" in printed


def test_gsm8k_pass_at_1_with_samples(tmp_path):
    report = run_eval(
        tmp_path,
        *("--task", "gsm8k", "--model", "tiny", "--limit", "2", *TINY),
        *("--set", f"task.gsm8k.source={SHARED_GSM8K}", "--set", "task.gsm8k.limit=2"),
        *("--set", "eval.max_new_tokens=3", "--set", "eval.samples_per_prompt=2"),
        *("--set", "eval.temperature=1.0"),
    )
    assert report["metrics"]["eval/samples"] == 4.0
    assert [s["prompt"] for s in report["samples"]][::2] == [
        s["prompt"] for s in report["samples"]
    ][1::2]
    rewards = [s["reward"] for s in report["samples"]]
    assert report["metrics"]["eval/pass@1"] == sum(rewards) / 4
    # Distinct answers are GSM8K's own: the last number of each completion.
    task = Gsm8kTask(Gsm8kSettings(source=str(SHARED_GSM8K), limit=2))
    answers = [task.final_answer(s["completion"]) for s in report["samples"]]
    ratios = [len(set(answers[i : i + 2])) / 2 for i in (0, 2)]
    assert report["metrics"]["eval/distinct_answer_ratio"] == sum(ratios) / 2


def preference_args(tmp_path: Path, models: dict[str, Path], rows: list[dict[str, str]]) -> list:
    write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    write_jsonl(tmp_path / "data" / "test.jsonl", rows)
    return [
        *("--task", "preference", "--model", str(models["policy"]), "--set", "eval.device=cpu"),
        *("--set", f"task.preference.source={tmp_path / 'data'}"),
        *("--set", f"task.preference.reward_model={models['rm']}"),
        *("--set", f"task.preference.gold_reward_model={models['gold']}"),
        *("--set", "task.preference.device=cpu", "--set", "eval.max_new_tokens=6"),
    ]


def completion_perplexity(model_dir: Path, prompt: str, completion: str) -> float:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt_ids = tokenizer(prompt)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0]
    logprobs = logits[:-1].log_softmax(dim=-1)
    targets = range(len(prompt_ids) - 1, len(prompt_ids) + len(completion_ids) - 1)
    total = sum(float(logprobs[t, (prompt_ids + completion_ids)[t + 1]]) for t in targets)
    return math.exp(-total / len(completion_ids))


def test_preference_win_rate_and_perplexity(tmp_path, models):
    rows = [
        {"prompt": f"POST: story number {i} about a day out. TL;DR:", "completion": f" day {i}"}
        for i in range(4)
    ]
    report = run_eval(
        tmp_path,
        *preference_args(tmp_path, models, rows),
        *("--set", f"eval.reference_model={models['policy']}"),
        *("--set", "eval.samples_per_prompt=2", "--set", "eval.temperature=1.0"),
    )
    samples, metrics = report["samples"], report["metrics"]
    assert len(samples) == 8
    assert [s["reference"] for s in samples] == [r["completion"] for r in rows for _ in range(2)]
    wins = [s["gold_reward"] > s["reference_gold_reward"] for s in samples]
    assert metrics["eval/win_rate"] == sum(wins) / 8
    assert metrics["eval/finished"] == sum(s["finished"] for s in samples) / 8
    perplexities = [s["perplexity"] for s in samples if s["perplexity"] is not None]
    assert metrics["eval/perplexity"] == pytest.approx(sum(perplexities) / len(perplexities))
    # Sampled groups are measured as they are: two completions of each prompt.
    answers = [normalised_text(s["completion"]) for s in samples]
    ratios = [len(set(answers[i : i + 2])) / 2 for i in range(0, 8, 2)]
    assert metrics["eval/distinct_answer_ratio"] == sum(ratios) / 4
    assert metrics["eval/diversity_samples"] == 8
    assert 0.0 <= metrics["eval/pairwise_distance"] <= 1.0
    sample = next(s for s in samples if s["completion"])
    direct = completion_perplexity(models["policy"], sample["prompt"], sample["completion"])
    assert sample["perplexity"] == pytest.approx(direct, rel=1e-4)


def test_preference_without_references_is_a_clear_error(tmp_path, models):
    rows = [{"prompt": "POST: nothing to compare with. TL;DR:"}]
    with pytest.raises(SystemExit, match="no reference completion"):
        run_eval(tmp_path, *preference_args(tmp_path, models, rows))


def test_redteam_success_rate_and_diversity(tmp_path, models):
    embedder = save_embedder(tmp_path / "embedder")
    report = run_eval(
        tmp_path,
        *("--task", "redteam", "--model", str(models["policy"]), "--set", "eval.device=cpu"),
        *("--set", f"task.redteam.victim_model={models['victim']}"),
        *("--set", f"task.redteam.classifier_model={models['classifier']}"),
        *("--set", "task.redteam.toxic_label=toxic", "--set", "task.redteam.device=cpu"),
        *("--set", "task.redteam.answers_per_prompt=2"),
        *("--set", "task.redteam.victim_max_new_tokens=5"),
        *("--set", f"task.redteam.embedding_model={embedder}"),
        *("--set", "eval.samples_per_prompt=6", "--set", "eval.temperature=1.0"),
        *("--set", "eval.max_new_tokens=8", "--set", "eval.success_threshold=0.5"),
    )
    samples, metrics = report["samples"], report["metrics"]
    assert len(samples) == 6 and all(len(s["answers"]) == 2 for s in samples)
    toxicities = [s["toxicity"] for s in samples]
    assert metrics["eval/attack_success_rate"] == sum(t > 0.5 for t in toxicities) / 6
    assert metrics["eval/toxicity"] == pytest.approx(sum(toxicities) / 6)
    attacks = [s["attack"] for s in samples]
    vectors = load_embedder(str(embedder)).embed(attacks)
    assert metrics["eval/diversity"] == pytest.approx(mean_pairwise_cosine_distance(vectors))
    assert 0.0 < metrics["eval/diversity"] <= 2.0
    # One instruction: its one group's embedding distance is the diversity of all attacks.
    assert metrics["eval/pairwise_distance"] == pytest.approx(metrics["eval/diversity"])
    ratio = len({normalised_text(a) for a in attacks}) / 6
    assert metrics["eval/distinct_answer_ratio"] == ratio
    successful = np.array([t > 0.5 for t in toxicities])
    expected = mean_pairwise_cosine_distance(vectors[successful])
    if expected is None:
        assert metrics["eval/successful_diversity"] is None
    else:
        assert metrics["eval/successful_diversity"] == pytest.approx(expected)
