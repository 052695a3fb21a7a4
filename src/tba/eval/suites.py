"""What `tba eval` measures for each kind of task, given a way to complete prompts:

- math (arithmetic, gsm8k and any task with a 0/1 reward): pass@1, the mean reward;
- preference: win rate of the policy's completions against the data set's reference
  completions under the gold reward model, and their perplexity under the reference model;
- redteam: attack success rate (mean p(toxic) of the victim's answers above a threshold) and
  diversity (mean pairwise cosine distance of the attacks' sentence embeddings);
- every task: the diversity of each prompt's completions as the searchers measure it
  (`tba.tasks.diversity`): distinct-answer ratio and mean pairwise distance, mean over
  prompts, of the scored completions when they are sampled groups, else of a few completions
  sampled for diversity alone (`DiversityDraw`).

Generation, perplexity and embeddings are injected, so this module runs no model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.eval.metrics import mean, success_rate, win_rate
from tba.tasks.base import Task
from tba.tasks.diversity import (
    final_answer,
    group_diversity,
    mean_diversity,
    mean_pairwise_cosine_distance,
)
from tba.tasks.embedding import Embedder
from tba.tasks.evaluate import evaluate
from tba.tasks.preference import PreferenceTask
from tba.tasks.redteam import RedteamTask


class Completed(Protocol):
    """A completion (tba.models.generate.GeneratedText)."""

    @property
    def text(self) -> str: ...

    @property
    def token_ids(self) -> list[int]: ...

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


@dataclass(frozen=True)
class DiversityDraw:
    """Completions drawn for the diversity metrics alone, when the scored ones are greedy or
    one per prompt: `samples` per prompt for the first `prompts` prompts, by `complete`
    (which samples)."""

    complete: Complete
    samples: int
    prompts: int


def repeat(prompts: Sequence[Prompt], n: int) -> list[Prompt]:
    """Each prompt n times in a row: n completions each, in prompt order."""
    return [prompt for prompt in prompts for _ in range(n)]


def evaluate_math(
    task: Task,
    prompts: Sequence[Prompt],
    complete: Complete,
    n: int,
    split: str,
    draw: DiversityDraw | None = None,
) -> EvalReport:
    """pass@1: the mean reward of n completions per prompt (0/1 rewards), and diversity."""
    rows = repeat(prompts, n)
    generated = complete([p.text for p in rows])
    # Completed before scoring, so that diversity sees their token ids too.
    result = evaluate(task, rows, lambda _: [g.text for g in generated])
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
    metrics |= diversity_metrics(task, measured_groups(prompts, generated, n, draw))
    return EvalReport(task.name, split, len(prompts), metrics, samples)


def evaluate_preference(
    task: PreferenceTask,
    prompts: Sequence[Prompt],
    complete: Complete,
    n: int,
    split: str,
    perplexity: Perplexity | None = None,
    draw: DiversityDraw | None = None,
) -> EvalReport:
    """Win rate against the reference completions (prompt.answer) under the gold reward
    model, gold rewards, the fraction of completions that ended, perplexity if given, and
    diversity."""
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
    metrics |= diversity_metrics(task, measured_groups(prompts, generated, n, draw))
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
    draw: DiversityDraw | None = None,
) -> EvalReport:
    """Attack success rate, toxicity and reward, the diversity of all attacks and of the
    successful ones, and per prompt (embedding distances: attacks are embedded anyway)."""
    rows = repeat(prompts, n)
    generated = complete([p.text for p in rows])
    attacks = [g.text for g in generated]
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
    groups = measured_groups(prompts, generated, n, draw)
    # The scored attacks' embeddings serve again; only drawn ones are embedded for this.
    group_embeddings = embeddings if draw is None else embedder.embed(_texts(groups))
    metrics |= diversity_metrics(task, groups, group_embeddings)
    samples = [
        {"prompt": p.text, "attack": attack, "answers": o.answers}
        | {"toxicity": o.toxicity, "reward": o.reward}
        for p, attack, o in zip(rows, attacks, outcomes, strict=True)
    ]
    return EvalReport(task.name, split, len(prompts), metrics, samples)


def measured_groups(
    prompts: Sequence[Prompt],
    generated: Sequence[Completed],
    n: int,
    draw: DiversityDraw | None,
) -> list[list[Completed]]:
    """Each prompt's completions whose diversity is measured: `draw`'s when given, else the
    scored ones (`generated`, n per prompt in a row)."""
    if draw is not None:
        n = draw.samples
        rows = repeat(prompts[: draw.prompts], n)
        generated = draw.complete([p.text for p in rows])
    return [list(generated[i : i + n]) for i in range(0, len(generated), n)]


def diversity_metrics(
    task: object, groups: Sequence[Sequence[Completed]], embeddings: npt.ArrayLike | None = None
) -> dict[str, float | None]:
    """Distinct-answer ratio and mean pairwise distance (cosine of `embeddings`, one row per
    completion in group order, else token bigrams), mean over the groups; and how many
    completions were measured."""
    vectors = None if embeddings is None else np.asarray(embeddings)
    per_group = []
    start = 0
    for group in groups:
        rows = None if vectors is None else vectors[start : start + len(group)]
        answers = [final_answer(task, c.text) for c in group]
        per_group.append(group_diversity(answers, [c.token_ids for c in group], rows))
        start += len(group)
    diversity = mean_diversity(per_group)
    return {
        "eval/distinct_answer_ratio": diversity.distinct_answer_ratio,
        "eval/pairwise_distance": diversity.pairwise_distance,
        "eval/diversity_samples": float(start),
    }


def _texts(groups: Sequence[Sequence[Completed]]) -> list[str]:
    return [c.text for group in groups for c in group]
