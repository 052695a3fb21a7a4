"""`gsm8k`: grade-school maths word problems in the `openai/gsm8k` format.

Rows hold a `question` and an `answer`: a worked solution whose final line is `#### <gold>`.
Prompts put the question in the settings' template; the prompt's answer is the gold number.
Two verifiers score a response: `last_number` (the last number in the text) and `math_verify`
(symbolic equivalence by the math-verify package, an optional extra: `tba[math]`).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.tasks.base import Split, make_prompt
from tba.tasks.config import Gsm8kSettings

NAME = "gsm8k"
ANSWER_MARKER = "####"
HUB_CONFIG = "main"
MATH_VERIFY_TIMEOUT_S = 2

# A number as people write it: `1,234.50`, `-7`, `.5`. The minus counts as a sign only where
# it cannot be a binary minus (`16-3` is 16 and 3), and a `$` may sit between sign and digits.
_NUMBER = re.compile(
    r"(?P<sign>(?<![0-9)\]])-)?\$?"
    r"(?P<digits>[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
)


class Gsm8kTask:
    def __init__(self, settings: Gsm8kSettings | None = None) -> None:
        self.settings = settings or Gsm8kSettings()
        self._verify = _verifier(self.settings.verifier)
        rows = _load_rows(self.settings.source, self.settings.limit)
        self._splits = {
            split: [self._prompt(question, gold) for question, gold in split_rows]
            for split, split_rows in rows.items()
        }

    @property
    def name(self) -> str:
        return NAME

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._splits[Split(split)])

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        return self._verify(prompt.answer, completion_text)

    def final_answer(self, completion_text: str) -> str | None:
        """The last number, as `last_number` reads it (also under `math_verify`, whose
        symbolic parse is too slow to run on every completion a searcher draws)."""
        value = last_number(completion_text)
        return None if value is None else format(value.normalize(), "f")

    def _prompt(self, question: str, gold: str) -> Prompt:
        # str.replace, not str.format: a template may hold other braces (LaTeX, JSON).
        text = self.settings.template.replace("{question}", question)
        return make_prompt(NAME, text, gold)


# --- rewards -------------------------------------------------------------------------------


def last_number_reward(gold: str, response: str) -> float:
    """1.0 when the last number of `response` equals `gold` numerically, else 0.0; never raises."""
    try:
        value = last_number(response)
        return 0.0 if value is None else float(value == _parse_number(gold))
    except Exception:
        return 0.0


def last_number(response: str) -> Decimal | None:
    """The value of the last number in `response`; None when it has none."""
    numbers = list(_NUMBER.finditer(response))
    return _number_value(numbers[-1]) if numbers else None


def math_verify_reward(gold: str, response: str) -> float:
    """1.0 when math-verify finds `response`'s answer equivalent to `gold`, else 0.0; never
    raises. Text after a final `####` marker, if any, is taken as the answer."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    # math-verify times out with SIGALRM, which only the main thread may use; elsewhere it
    # runs without a timeout.
    timeout_s = MATH_VERIFY_TIMEOUT_S if _in_main_thread() else None
    answer_text = response.rsplit(ANSWER_MARKER, 1)[-1]
    try:
        gold_parsed = parse(gold, parsing_timeout=timeout_s)
        answer_parsed = parse(answer_text, parsing_timeout=timeout_s)
        return 1.0 if verify(gold_parsed, answer_parsed, timeout_seconds=timeout_s) else 0.0
    except (Exception, TimeoutException):
        return 0.0


def _verifier(name: str) -> Callable[[str, str], float]:
    if name == "last_number":
        return last_number_reward
    try:
        import math_verify  # noqa: F401
    except ImportError as e:
        raise InvalidArgumentError(
            "verifier 'math_verify' needs the math-verify package: pip install 'tba[math]'"
        ) from e
    return math_verify_reward


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _number_value(match: re.Match[str]) -> Decimal:
    value = Decimal(match["digits"].replace(",", ""))
    return -value if match["sign"] else value


def _parse_number(text: str) -> Decimal:
    return Decimal(text.strip().replace(",", "").replace("$", ""))


# --- loading -------------------------------------------------------------------------------


def gold_answer(solution: str) -> str:
    """The gold number of a GSM8K solution: the text after its last `####`, without commas."""
    if ANSWER_MARKER not in solution:
        raise ValueError(f"the answer has no {ANSWER_MARKER!r} line")
    gold = solution.rsplit(ANSWER_MARKER, 1)[1].strip().replace(",", "")
    if not gold:
        raise ValueError(f"nothing follows {ANSWER_MARKER!r} in the answer")
    return gold


def _load_rows(source: str, limit: int | None) -> dict[Split, list[tuple[str, str]]]:
    """(question, gold) pairs per split, from a local directory or the hub."""
    directory = Path(source)
    if directory.is_dir():
        return {split: _read_jsonl(directory / f"{split}.jsonl", limit) for split in Split}
    return _load_hub(source, limit)


def _read_jsonl(path: Path, limit: int | None) -> list[tuple[str, str]]:
    if not path.is_file():
        raise InvalidArgumentError(f"gsm8k: {path} is missing (need train.jsonl and test.jsonl)")
    pairs: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if limit is not None and len(pairs) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(f"gsm8k: {where}: not valid JSON ({e.msg})") from e
            pairs.append(_question_and_gold(row, where))
    return pairs


def _load_hub(source: str, limit: int | None) -> dict[Split, list[tuple[str, str]]]:
    try:
        import datasets
    except ImportError as e:
        raise InvalidArgumentError(
            f"gsm8k: {source!r} is not a directory, and loading it by hub name needs the "
            "`datasets` package (pip install datasets)"
        ) from e
    try:
        dataset = datasets.load_dataset(source, HUB_CONFIG)
        return {split: _hub_split(dataset[str(split)], source, split, limit) for split in Split}
    except InvalidArgumentError:
        raise
    except Exception as e:
        raise InvalidArgumentError(
            f"gsm8k: {source!r} is not a directory, and loading it from the hub failed: {e}"
        ) from e


def _hub_split(
    rows: Iterable[Any], source: str, split: Split, limit: int | None
) -> list[tuple[str, str]]:
    return [
        _question_and_gold(row, f"{source} [{split}] row {index}")
        for index, row in enumerate(itertools.islice(rows, limit))
    ]


def _question_and_gold(row: Any, where: str) -> tuple[str, str]:
    if not isinstance(row, dict):
        raise InvalidArgumentError(f"gsm8k: {where}: a row must be a JSON object")
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise InvalidArgumentError(f"gsm8k: {where}: missing or empty string field 'question'")
    if not isinstance(solution, str):
        raise InvalidArgumentError(f"gsm8k: {where}: missing string field 'answer'")
    try:
        return question, gold_answer(solution)
    except ValueError as e:
        raise InvalidArgumentError(f"gsm8k: {where}: {e}") from e
