"""The preference task: prompts and references from JSONL, reward model scores at the last
token (batched as one row alone), the -1 penalty for unfinished completions, the gold model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import BatchRewarder, Split, batch_rewards
from tba.tasks.config import ArithmeticSettings, PreferenceSettings, TaskSettings
from tba.tasks.preference import PreferenceTask
from tba.tasks.registry import build_task
from tests.fixtures.tiny_models import save_classifier, write_jsonl


def close(expected: object) -> object:
    """Equal up to float noise: padding a row into a batch moves its score by ~1e-7."""
    return pytest.approx(expected, abs=1e-5)


ROWS = [
    {"prompt": "POST: my cat ate my homework. TL;DR:", "completion": " cat ate homework"},
    {"prompt": "POST: rain all week, so I stayed in and read. TL;DR:", "completion": " rain"},
    {"prompt": "POST: short. TL;DR:", "completion": " short post"},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("preference-models")
    return {
        "rm": save_classifier(root / "rm", seed=1),
        "gold": save_classifier(root / "gold", seed=2),
        "rm_pad_eos": save_classifier(root / "rm-pad-eos", seed=3, pad_is_eos=True),
    }


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "data" / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "data" / "test.jsonl", ROWS[:2])
    return tmp_path / "data"


def make_task(data: Path, models: dict[str, Path], **overrides: object) -> PreferenceTask:
    fields: dict[str, object] = {
        "source": str(data),
        "reward_model": str(models["rm"]),
        "device": "cpu",
    }
    return PreferenceTask(PreferenceSettings(**(fields | overrides)))


def last_token_score(path: Path, text: str, append_eos: bool = False) -> float:
    """The reward model's score of one unpadded row, read by hand at its last position."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    ids = tokenizer(text)["input_ids"] + ([tokenizer.eos_token_id] if append_eos else [])
    with torch.no_grad():
        hidden = model.transformer(input_ids=torch.tensor([ids])).last_hidden_state
        return float(model.score(hidden[:, -1])[0, 0])


def test_prompts_and_references_come_from_the_split_files(data, models):
    task = make_task(data, models)
    train = task.prompts(Split.TRAIN)
    assert [p.text for p in train] == [r["prompt"] for r in ROWS]
    assert [p.answer for p in train] == [r["completion"] for r in ROWS]
    assert len(task.prompts(Split.TEST)) == 2
    assert len(make_task(data, models, limit=1).prompts(Split.TRAIN)) == 1


def test_field_names_and_split_names_are_settings(tmp_path, models):
    rows = [{"query": r["prompt"], "reference_response": r["completion"]} for r in ROWS]
    write_jsonl(tmp_path / "validation.jsonl", rows)
    write_jsonl(tmp_path / "train.jsonl", rows)
    task = make_task(
        tmp_path,
        models,
        test_split="validation",
        prompt_field="query",
        reference_field="reference_response",
    )
    assert task.prompts(Split.TEST)[0].answer == ROWS[0]["completion"]


def test_bad_data_and_missing_models_are_clear_errors(tmp_path, data, models):
    with pytest.raises(InvalidArgumentError, match="reward_model"):
        PreferenceTask(PreferenceSettings(source=str(data)))
    write_jsonl(tmp_path / "bad" / "train.jsonl", [{"text": "no prompt field"}])
    write_jsonl(tmp_path / "bad" / "test.jsonl", ROWS)
    with pytest.raises(InvalidArgumentError, match="'prompt'"):
        make_task(tmp_path / "bad", models)
    with pytest.raises(InvalidArgumentError, match="datasets"):
        make_task(tmp_path / "not-a-directory", models)
    task = make_task(data, models, reward_model=str(tmp_path / "no-model-here"))
    with pytest.raises(InvalidArgumentError, match="cannot load"):
        task.reward(task.prompts(Split.TRAIN)[0], "x")


def test_scores_are_read_at_the_last_token_whatever_the_batch(data, models):
    task = make_task(data, models, batch_size=3)
    prompts = task.prompts(Split.TRAIN)
    completions = [" a", " a much longer completion than the others", ""]
    rewards = task.rewards(prompts, completions, [True, True, True])
    expected = [
        last_token_score(models["rm"], p.text + c)
        for p, c in zip(prompts, completions, strict=True)
    ]
    assert rewards == close(expected)
    assert len(set(rewards)) == 3
    assert task.reward(prompts[1], completions[1]) == close(expected[1])


def test_eos_is_scored_even_where_it_is_the_pad_token(data, models):
    """With pad == EOS a pooling that looks for the last non-pad id would skip the EOS."""
    task = make_task(data, models, reward_model=str(models["rm_pad_eos"]), append_eos=True)
    prompt = task.prompts(Split.TRAIN)[0]
    [reward] = task.rewards([prompt], [" cat"], [True])
    with_eos = last_token_score(models["rm_pad_eos"], prompt.text + " cat", append_eos=True)
    without_eos = last_token_score(models["rm_pad_eos"], prompt.text + " cat")
    assert reward == close(with_eos)
    assert reward != close(without_eos)
    # A text that already ends with EOS (as reference responses often do) gets no second one.
    assert task.rewards([prompt], [" cat<eos>"], [True]) == [close(reward)]


def test_unfinished_completions_get_the_penalty(data, models):
    task = make_task(data, models)
    prompts = task.prompts(Split.TRAIN)[:2]
    finished_reward, penalised = task.rewards(prompts, [" a", " b"], [True, False])
    assert penalised == -1.0
    assert finished_reward == close(last_token_score(models["rm"], prompts[0].text + " a"))
    unpenalised = make_task(data, models, unfinished_reward=None)
    [scored] = unpenalised.rewards(prompts[1:], [" b"], [False])
    assert scored == close(last_token_score(models["rm"], prompts[1].text + " b"))
    custom = make_task(data, models, unfinished_reward=-3.5)
    assert custom.rewards(prompts[1:], [" b"], [False]) == [-3.5]


def test_gold_scores_use_the_gold_model_unpenalised(data, models):
    task = make_task(data, models, gold_reward_model=str(models["gold"]))
    prompt = task.prompts(Split.TEST)[0]
    [gold] = task.gold_scores([prompt], [prompt.answer])
    assert gold == close(last_token_score(models["gold"], prompt.text + prompt.answer))
    assert gold != close(task.reward(prompt, prompt.answer))
    same = make_task(data, models)
    assert same.gold_scores([prompt], [" x"]) == [same.reward(prompt, " x")]


def test_batch_rewards_uses_the_batched_method_or_falls_back(data, models):
    task = build_task(
        TaskSettings(
            name="preference",
            preference=PreferenceSettings(
                source=str(data), reward_model=str(models["rm"]), device="cpu"
            ),
        )
    )
    assert isinstance(task, BatchRewarder)
    prompts = task.prompts(Split.TRAIN)
    rewards = batch_rewards(task, prompts, [" a", " b", " c"], [True, False, True])
    assert rewards[1] == -1.0
    assert rewards[0] == close(task.reward(prompts[0], " a"))

    arithmetic = ArithmeticTask(ArithmeticSettings(test_size=4))
    assert not isinstance(arithmetic, BatchRewarder)
    sums = arithmetic.prompts(Split.TEST)
    texts = [sums[0].answer, "wrong", sums[2].answer, sums[3].answer]
    # The arithmetic reward ignores `finished`: an exact answer scores, cut or not.
    assert batch_rewards(arithmetic, sums, texts, [True, True, False, True]) == [1.0, 0, 1, 1]
    with pytest.raises(InvalidArgumentError, match="must match"):
        batch_rewards(arithmetic, sums, texts[:3], [True] * 4)
    assert batch_rewards(task, [], [], []) == []


def test_reference_completions_may_be_missing_from_rows(tmp_path, models):
    rows = [{"prompt": "POST: no reference here. TL;DR:"}]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", rows)
    [prompt] = make_task(tmp_path, models).prompts(Split.TEST)
    assert prompt == Prompt(id=prompt.id, text=rows[0]["prompt"], answer="")
