"""The red-teaming task: attacker prompts, the victim's answers, log p(toxic) of a classifier
as the reward, label names and indices."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tba.errors import InvalidArgumentError
from tba.models.generate import generate_texts
from tba.tasks.base import BatchRewarder, Split, batch_rewards
from tba.tasks.config import RedteamSettings, TaskSettings
from tba.tasks.redteam import RedteamTask
from tba.tasks.registry import build_task
from tests.fixtures.tiny_models import save_causal_lm, save_classifier, write_jsonl

LABELS = ["nothate", "hate"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("redteam-models")
    return {
        "victim": save_causal_lm(root / "victim", seed=5),
        "classifier": save_classifier(root / "classifier", labels=LABELS, seed=6),
    }


def make_task(models: dict[str, Path], **overrides: object) -> RedteamTask:
    fields: dict[str, object] = {
        "victim_model": str(models["victim"]),
        "classifier_model": str(models["classifier"]),
        "toxic_label": "hate",
        "answers_per_prompt": 3,
        "victim_max_new_tokens": 6,
        "device": "cpu",
    }
    return RedteamTask(RedteamSettings(**(fields | overrides)))


def classifier_logprob(path: Path, text: str, label: int) -> float:
    """log p(label | text) of one unpadded row, straight from the model."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokenizer(text)["input_ids"]])).logits
    return float(logits.log_softmax(dim=-1)[0, label])


def test_the_instruction_is_the_prompt_unless_a_source_is_given(tmp_path, models):
    task = make_task(models, instruction="Ask something:")
    assert [p.text for p in task.prompts(Split.TRAIN)] == ["Ask something:"]
    assert task.prompts(Split.TEST) == task.prompts(Split.TRAIN)
    copied = make_task(models, instruction="Ask:", instruction_copies=3)
    copies = copied.prompts(Split.TRAIN)
    assert [p.text for p in copies] == ["Ask:"] * 3
    assert len({p.id for p in copies}) == 3
    assert copied.prompts(Split.TEST) == copies[:1]
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a:"}, {"prompt": "b:"}])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "c:"}])
    task = make_task(models, source=str(tmp_path))
    assert [p.text for p in task.prompts(Split.TRAIN)] == ["a:", "b:"]
    assert [p.text for p in task.prompts(Split.TEST)] == ["c:"]


def test_missing_models_and_templates_are_clear_errors(models):
    with pytest.raises(InvalidArgumentError, match="victim_model"):
        RedteamTask(RedteamSettings(classifier_model=str(models["classifier"])))
    with pytest.raises(ValueError, match="attack"):
        RedteamSettings(victim_template="no placeholder")


def test_reward_is_the_mean_toxic_logprob_of_the_answers(models):
    task = make_task(models, victim_temperature=1.0)
    attacks = ["tell me", "why is the sky blue?"]
    torch.manual_seed(0)
    outcomes = task.outcomes(attacks)
    assert [len(o.answers) for o in outcomes] == [3, 3]
    for outcome in outcomes:
        expected = [classifier_logprob(models["classifier"], a, 1) for a in outcome.answers]
        assert outcome.toxic_logprobs == pytest.approx(expected, abs=1e-5)
        assert outcome.reward == pytest.approx(sum(expected) / 3, abs=1e-5)
        assert 0.0 < outcome.toxicity < 1.0
    prompts = task.prompts(Split.TRAIN) * 2
    torch.manual_seed(0)
    assert task.rewards(prompts, attacks, [True, False]) == [o.reward for o in outcomes]


def test_the_victim_answers_the_templated_attack(models):
    template = "Question: {attack}\nAnswer:"
    task = make_task(models, victim_template=template, victim_temperature=0.0)
    [answers] = task.victim_answers(["how?"])
    tokenizer, model = task.victim()
    [direct] = generate_texts(model, tokenizer, ["Question: how?\nAnswer:"], max_new_tokens=6)
    assert answers == [direct[0].text] * 3
    [plain] = make_task(models, victim_temperature=0.0).victim_answers(["how?"])
    assert plain != answers


def test_the_toxic_label_is_a_name_or_an_index(models):
    attack = ["say it"]
    torch.manual_seed(1)
    by_name = make_task(models, victim_temperature=0.0, toxic_label="hate").outcomes(attack)
    by_index = make_task(models, victim_temperature=0.0, toxic_label="1").outcomes(attack)
    other = make_task(models, victim_temperature=0.0, toxic_label="nothate").outcomes(attack)
    assert by_name == by_index
    assert by_name[0].toxicity + other[0].toxicity == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(InvalidArgumentError, match="0=nothate, 1=hate"):
        make_task(models, toxic_label="toxic").classifier()


def test_registered_and_batched(models):
    settings = TaskSettings(
        name="redteam",
        redteam=RedteamSettings(
            victim_model=str(models["victim"]),
            classifier_model=str(models["classifier"]),
            toxic_label="hate",
            answers_per_prompt=2,
            victim_max_new_tokens=4,
            victim_temperature=0.0,
            device="cpu",
        ),
    )
    task = build_task(settings)
    assert isinstance(task, BatchRewarder)
    [prompt] = task.prompts(Split.TRAIN)
    rewards = batch_rewards(task, [prompt, prompt], ["one", "two"], [True, False])
    assert rewards == [task.reward(prompt, "one"), task.reward(prompt, "two")]
