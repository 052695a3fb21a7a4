"""What `tba eval` measures for each kind of task, given a way to complete prompts:

- math (arithmetic, gsm8k and any task with a 0/1 reward): pass@1, the mean reward;
- preference: win rate of the policy's completions against the data set's reference
  completions under the gold reward model, and their perplexity under the reference model;
- redteam: attack success rate (mean p(toxic) of the victim's answers above a threshold) and
  diversity (mean pairwise cosine distance of the attacks' sentence embeddings).

Generation, perplexity and embeddings are injected, so this module runs no model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.eval.metrics import mean, success_rate, win_rate
from tba.tasks.base import Task
from tba.tasks.diversity import mean_pairwise_cosine_distance
from tba.tasks.embedding import Embedder
from tba.tasks.evaluate import evaluate
from tba.tasks.preference import PreferenceTask
from tba.tasks.redteam import RedteamTask


class Completed(Protocol):
    """A completion (tba.models.generate.GeneratedText)."""

    @property
    def text(self) -> str: ...

    @property
    def finished(self) -> bool: ...


# One completion per prompt text, in order.
Complete = Callable[[Sequence[str]], Sequence[Completed]]
# Perplexity of each (prompt text, completion text) pair; None where there is no token.
Perplexity = Callable[[Sequence[str], Sequence[str]], list[float | None]]


@dataclass
class EvalReport:
    task: str
    split: str
    prompts: int
    metrics: dict[str, float | None]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "split": self.split,
            "prompts": self.prompts,
            "metrics": self.metrics,
            "samples": self.samples,
        }


def repeat(prompts: Sequence[Prompt], n: int) -> list[Prompt]:
    """Each prompt n times in a row: n completions each, in prompt order."""
    return [prompt for prompt in prompts for _ in range(n)]


def evaluate_math(
    task: Task, prompts: Sequence[Prompt], complete: Complete, n: int, split: str
) -> EvalReport:
    """pass@1: the mean reward of n completions per prompt (0/1 rewards)."""
    result = evaluate(
        task, repeat(prompts, n), lambda batch: [g.text for g in complete([p.text for p in batch])]
    )
    samples = [
        {"prompt": r.prompt.text, "answer": r.prompt.answer, "completion": r.completion_text}
        | {"reward": r.reward}
        for r in result.results
    ]
    metrics: dict[str, float | None] = {
        "eval/pass@1": result.accuracy,
        "eval/prompts": float(len(prompts)),
        "eval/samples": float(result.count),
    }
    return EvalReport(task.name, split, len(prompts), metrics, samples)


def evaluate_preference(
    task: PreferenceTask,
    prompts: Sequence[Prompt],
    complete: Complete,
    n: int,
    split: str,
    perplexity: Perplexity | None = None,
) -> EvalReport:
    """Win rate against the reference completions (prompt.answer) under the gold reward
    model, gold rewards, the fraction of completions that ended, and perplexity if given."""
    missing = sum(not p.answer for p in prompts)
    if missing:
        raise InvalidArgumentError(
            f"preference: {missing} of {len(prompts)} prompts have no reference completion "
            f"(field {task.settings.reference_field!r}); the win rate needs one for each"
        )
    rows = repeat(prompts, n)
    generated = complete([p.text for p in rows])
    texts = [g.text for g in generated]
    policy_gold = task.gold_scores(rows, texts)
    # References are scored once per prompt, then paired with each of its n completions.
    unique_reference_gold = task.gold_scores(prompts, [p.answer for p in prompts])
    reference_gold = [score for score in unique_reference_gold for _ in range(n)]
    perplexities = perplexity([p.text for p in rows], texts) if perplexity else [None] * len(rows)
    measured = [v for v in perplexities if v is not None]
    metrics: dict[str, float | None] = {
        "eval/win_rate": win_rate(policy_gold, reference_gold),
        "eval/gold_reward": mean(policy_gold),
        "eval/reference_gold_reward": mean(reference_gold),
        "eval/perplexity": mean(measured),
        "eval/finished": mean([float(g.finished) for g in generated]),
        "eval/prompts": float(len(prompts)),
        "eval/samples": float(len(rows)),
    }
    samples = [
        {"prompt": p.text, "reference": p.answer, "completion": g.text, "finished": g.finished}
        | {"gold_reward": gold, "reference_gold_reward": ref, "perplexity": ppl}
        for p, g, gold, ref, ppl in zip(
            rows, generated, policy_gold, reference_gold, perplexities, strict=True
        )
    ]
    return EvalReport(task.name, split, len(prompts), metrics, samples)


def evaluate_redteam(
    task: RedteamTask,
    prompts: Sequence[Prompt],
    complete: Complete,
    n: int,
    split: str,
    embedder: Embedder,
    threshold: float,
) -> EvalReport:
    """Attack success rate, toxicity and reward, and the diversity of all attacks and of the
    successful ones."""
    rows = repeat(prompts, n)
    attacks = [g.text for g in complete([p.text for p in rows])]
    outcomes = task.outcomes(attacks)
    toxicities = [o.toxicity for o in outcomes]
    embeddings = embedder.embed(attacks)
    successful = [i for i, t in enumerate(toxicities) if t > threshold]
    metrics: dict[str, float | None] = {
        "eval/attack_success_rate": success_rate(toxicities, threshold),
        "eval/diversity": mean_pairwise_cosine_distance(embeddings),
        "eval/successful_diversity": mean_pairwise_cosine_distance(embeddings[successful]),
        "eval/toxicity": mean(toxicities),
        "eval/reward": mean([o.reward for o in outcomes]),
        "eval/prompts": float(len(prompts)),
        "eval/samples": float(len(rows)),
    }
    samples = [
        {"prompt": p.text, "attack": attack, "answers": o.answers}
        | {"toxicity": o.toxicity, "reward": o.reward}
        for p, attack, o in zip(rows, attacks, outcomes, strict=True)
    ]
    return EvalReport(task.name, split, len(prompts), metrics, samples)
