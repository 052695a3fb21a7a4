"""The gsm8k task on real rows of ../shared/data/gsm8k: loading, templates, both verifiers."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tba.errors import InvalidArgumentError
from tba.tasks.base import Split, make_prompt
from tba.tasks.config import DEFAULT_GSM8K_TEMPLATE, Gsm8kSettings
from tba.tasks.gsm8k import (
    Gsm8kTask,
    gold_answer,
    last_number_reward,
    math_verify_reward,
)

SHARED_GSM8K = Path(__file__).parents[2].parent / "shared" / "data" / "gsm8k"
VERIFIERS = ["last_number", "math_verify"]
REWARDS = [last_number_reward, math_verify_reward]


@pytest.fixture(scope="module")
def gsm8k_dir() -> Path:
    if not (SHARED_GSM8K / "test.jsonl").is_file():
        pytest.fail(f"GSM8K test data missing: expected {SHARED_GSM8K}/{{train,test}}.jsonl")
    return SHARED_GSM8K


def raw_rows(directory: Path, split: str, count: int) -> list[dict[str, str]]:
    with (directory / f"{split}.jsonl").open(encoding="utf-8") as lines:
        return [json.loads(line) for line, _ in zip(lines, range(count), strict=False)]


def task(directory: Path, **overrides: Any) -> Gsm8kTask:
    return Gsm8kTask(Gsm8kSettings(source=str(directory), **overrides))


# --- real rows ------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", VERIFIERS)
def test_gold_solution_scores_one_and_a_wrong_number_zero(gsm8k_dir, verifier):
    # Rows 226 and 258 hold earlier numbers math-verify would take without the `####` marker.
    count = 300
    gsm8k = task(gsm8k_dir, verifier=verifier, limit=count)
    prompts = gsm8k.prompts(Split.TEST)
    rows = raw_rows(gsm8k_dir, "test", count)
    assert len(prompts) == len(rows) == count
    for prompt, row in zip(prompts, rows, strict=True):
        solution = row["answer"]
        wrong = str(int(prompt.answer) + 1)
        assert gsm8k.reward(prompt, solution) == 1.0, solution
        assert gsm8k.reward(prompt, f"{solution.rsplit('####', 1)[0]}#### {wrong}") == 0.0
        assert gsm8k.reward(prompt, f"The answer is {wrong}.") == 0.0


def test_gold_answers_are_the_numbers_after_the_marker_without_commas(gsm8k_dir):
    prompts = task(gsm8k_dir).prompts(Split.TRAIN)
    assert len(prompts) == 7473
    assert all(p.answer.lstrip("-").isdigit() for p in prompts)
    assert any(p.answer == "850000" for p in prompts)  # `#### 850,000` in the data
    assert len(task(gsm8k_dir).prompts(Split.TEST)) == 1319


def test_limit_takes_the_first_rows_of_each_split(gsm8k_dir):
    gsm8k = task(gsm8k_dir, limit=3)
    for split in Split:
        rows = raw_rows(gsm8k_dir, split, 3)
        prompts = gsm8k.prompts(split)
        assert [p.answer for p in prompts] == [gold_answer(r["answer"]) for r in rows]
        assert [p.text for p in prompts] == [
            DEFAULT_GSM8K_TEMPLATE.format(question=r["question"]) for r in rows
        ]


def test_default_template_is_the_papers(gsm8k_dir):
    prompt = task(gsm8k_dir, limit=1).prompts(Split.TEST)[0]
    question = raw_rows(gsm8k_dir, "test", 1)[0]["question"]
    assert prompt.text == f"[MATH_TASK] Problem:\n{question}\n\nSolution:"


def test_custom_template_keeps_other_braces(gsm8k_dir):
    template = "Q: {question}\nPut the answer in \\boxed{}.\nA:"
    prompt = task(gsm8k_dir, limit=1, template=template).prompts(Split.TEST)[0]
    question = raw_rows(gsm8k_dir, "test", 1)[0]["question"]
    assert prompt.text == f"Q: {question}\nPut the answer in \\boxed{{}}.\nA:"


def test_prompt_ids_depend_only_on_content(gsm8k_dir):
    first = task(gsm8k_dir, limit=5).prompts(Split.TEST)
    again = task(gsm8k_dir, limit=5).prompts(Split.TEST)
    assert [p.id for p in first] == [p.id for p in again]
    assert all(p == make_prompt("gsm8k", p.text, p.answer) for p in first)
    assert all(p.id.startswith("gsm8k-") for p in first)


# --- bad input ------------------------------------------------------------------------------

GOOD_ROW = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "must be a JSON object"),
        (json.dumps({"answer": "#### 2"}), "'question'"),
        (json.dumps({"question": "q", "answer": 2}), "'answer'"),
        (json.dumps({"question": "q", "answer": "it is 2"}), "no '####'"),
        (json.dumps({"question": "q", "answer": "it is 2\n####  "}), "nothing follows"),
    ],
)
def test_bad_rows_name_the_file_and_line(tmp_path, bad_line, message):
    (tmp_path / "train.jsonl").write_text(GOOD_ROW + "\n")
    (tmp_path / "test.jsonl").write_text(f"{GOOD_ROW}\n\n{bad_line}\n")
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        task(tmp_path)
    assert f"{tmp_path / 'test.jsonl'}:3" in str(caught.value)


def test_rows_after_the_limit_are_not_read(tmp_path):
    (tmp_path / "train.jsonl").write_text(f"{GOOD_ROW}\n{{not json\n")
    (tmp_path / "test.jsonl").write_text(f"\n{GOOD_ROW}\n")
    gsm8k = task(tmp_path, limit=1)
    assert [p.answer for p in gsm8k.prompts(Split.TRAIN)] == ["2"]
    assert [p.answer for p in gsm8k.prompts(Split.TEST)] == ["2"]


def test_a_missing_split_file_is_named(tmp_path):
    (tmp_path / "train.jsonl").write_text(GOOD_ROW + "\n")
    with pytest.raises(InvalidArgumentError, match=r"test\.jsonl is missing"):
        task(tmp_path)


def test_a_source_that_is_no_directory_goes_to_the_hub_and_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        task(tmp_path / "no-such-dir")


def test_math_verify_without_the_package_is_a_clear_error(gsm8k_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(InvalidArgumentError, match=r"tba\[math\]"):
        task(gsm8k_dir, verifier="math_verify", limit=1)


# --- rewards --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("1234", "The answer is 1,234.", 1.0),
        ("1234", "1,234.00 dollars", 1.0),
        ("12.5", "It costs $12.50 in total.", 1.0),
        ("12.50", "12.5", 1.0),
        ("-5", "The change is -5", 1.0),
        ("-5", "a loss of -$5", 1.0),
        ("5", "The change is -5", 0.0),
        ("3", "16-3", 1.0),  # a binary minus, not a sign
        ("18", "She makes $<<9*2=18>>18.", 1.0),
        ("0.5", "that is .5", 1.0),
        ("5", "1,2,3,4,5", 1.0),  # a list, not one number with commas
        ("34", "12,34", 1.0),
        ("1,600", "1600", 1.0),
        ("7", "7 apples, then 8", 0.0),
        ("7", "no number at all", 0.0),
        ("7", "", 0.0),
        ("seven", "7", 0.0),  # a gold that is no number never matches
    ],
)
def test_last_number(gold, response, expected):
    assert last_number_reward(gold, response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("1234", "The answer is 1,234.", 1.0),
        ("12.5", "It costs $12.50 in total.", 1.0),
        ("18", "Work: 9*2 = 18 ... #### 18", 1.0),
        ("18", "#### 19", 0.0),
        ("7", "", 0.0),
    ],
)
def test_math_verify(gold, response, expected):
    assert math_verify_reward(gold, response) == expected


def test_math_verify_works_off_the_main_thread():
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(math_verify_reward("18", "#### 18")))
    worker.start()
    worker.join()
    assert results == [1.0]


GARBAGE = [
    "9" * 100_000,
    "1," * 50_000,
    "-" * 10_000 + "5",
    "x" * 200_000,
    "\x00\ud800\U0001f600 ١٢٣ ²³ ½",
    "\\frac{" * 5_000,
    "$" * 10_000,
    "(" * 10_000,
    "#### " * 1_000,
]


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_rewards_survive_garbage(reward, text):
    assert reward("123", text) == 0.0
    assert reward(text, "123") == 0.0


def test_math_verify_gives_up_on_huge_powers():
    # 10^(10^10) would take sympy hours: math-verify's timeout must cut it short.
    assert math_verify_reward("123", "10**10**10") == 0.0


@pytest.mark.parametrize("reward", REWARDS)
@settings(max_examples=150, deadline=None)
@given(gold=st.one_of(st.integers().map(str), st.text(max_size=20)), text=st.text(max_size=500))
def test_rewards_never_raise(reward, gold, text):
    assert reward(gold, text) in (0.0, 1.0)


@settings(max_examples=150, deadline=None)
@given(value=st.integers(min_value=-(10**12), max_value=10**12), words=st.text(max_size=50))
def test_last_number_finds_any_integer_at_the_end(value, words):
    text = f"{words} so the answer is {value:,}"
    assert last_number_reward(str(value), text) == 1.0
