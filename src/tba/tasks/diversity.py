"""How diverse one prompt's group of completions is, the paper's second claim (off-policy
search finds more diverse solutions), measured the same way by the searcher per round and by
`tba eval` per model:

- the distinct-answer ratio: distinct final answers / completions. A task that parses a final
  answer for its reward says what "the answer" is (`AnswerReader`: the sum in arithmetic, the
  last number in GSM8K); for any other task it is the completion's text with case and
  whitespace normalised. A completion with no answer counts as one more answer, "none", so
  gibberish does not pass for diversity.
- the mean pairwise distance: 1 - cosine similarity of the completions' embeddings where
  embeddings are at hand, else 1 - Jaccard similarity of their token bigram sets. Bigrams,
  not unigrams, because a bag of tokens cannot tell two orderings of the same words apart;
  not longer n-grams, because on the short completions of maths tasks nearly every pair
  would then share nothing and read as entirely distinct.

A group of one completion has neither value (None, never 0): diversity needs two to compare.
Pure functions of texts, token ids and vectors: no model runs here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tba.tasks.base import AnswerReader

BIGRAM = 2


@dataclass(frozen=True, slots=True)
class Diversity:
    """A group's (or the mean over groups') distinct-answer ratio and mean pairwise
    distance; None where no group had two completions."""

    distinct_answer_ratio: float | None
    pairwise_distance: float | None


def normalised_text(text: str) -> str:
    """Case folded, runs of whitespace as one space, no space at either end."""
    return " ".join(text.split()).casefold()


def final_answer(task: object, completion_text: str) -> str | None:
    """The task's own final answer when it parses one, else the normalised text."""
    if isinstance(task, AnswerReader):
        return task.final_answer(completion_text)
    return normalised_text(completion_text)


def distinct_answer_ratio(answers: Sequence[str | None]) -> float | None:
    """Distinct answers / answers, in [1/n, 1] (None counts as one answer); None for n < 2."""
    if len(answers) < 2:
        return None
    return len(set(answers)) / len(answers)


def ngrams(token_ids: Sequence[int], n: int = BIGRAM) -> frozenset[tuple[int, ...]]:
    """The set of n-grams; a sequence shorter than n is its own one gram, so two equal short
    (or empty) completions are at distance 0 and two different ones at 1."""
    count = max(1, len(token_ids) - n + 1)
    return frozenset(tuple(token_ids[i : i + n]) for i in range(count))


def jaccard_distance(a: frozenset[tuple[int, ...]], b: frozenset[tuple[int, ...]]) -> float:
    """1 - |a & b| / |a | b|: 0 for equal sets, 1 for disjoint ones."""
    union = len(a | b)
    return 1.0 - len(a & b) / union if union else 0.0


def mean_pairwise_ngram_distance(
    token_ids: Sequence[Sequence[int]], n: int = BIGRAM
) -> float | None:
    """Mean Jaccard distance of the n-gram sets over all pairs; None for fewer than two."""
    if len(token_ids) < 2:
        return None
    sets = [ngrams(ids, n) for ids in token_ids]
    distances = [jaccard_distance(a, b) for a, b in itertools.combinations(sets, 2)]
    return math.fsum(distances) / len(distances)


def mean_pairwise_cosine_distance(embeddings: npt.ArrayLike) -> float | None:
    """Mean of 1 - cos(e_i, e_j) over all pairs i != j; None for fewer than two rows.

    O(n d): the sum of all pairwise cosines of unit vectors u_i is |sum u_i|^2 - n."""
    vectors = np.asarray(embeddings, dtype=np.float64)
    n = vectors.shape[0]
    if n < 2:
        return None
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms > 0, norms, 1.0)
    total = unit.sum(axis=0)
    pair_cosines = float(total @ total) - float((unit * unit).sum())
    return 1.0 - pair_cosines / (n * (n - 1))


def group_diversity(
    answers: Sequence[str | None],
    token_ids: Sequence[Sequence[int]],
    embeddings: npt.ArrayLike | None = None,
) -> Diversity:
    """One prompt's group: cosine distances of `embeddings` when given (one row per
    completion), else bigram distances of `token_ids`."""
    if len(answers) != len(token_ids):
        raise ValueError(f"{len(answers)} answers for {len(token_ids)} completions")
    distance = (
        mean_pairwise_ngram_distance(token_ids)
        if embeddings is None
        else mean_pairwise_cosine_distance(embeddings)
    )
    return Diversity(distinct_answer_ratio(answers), distance)


def mean_diversity(groups: Iterable[Diversity]) -> Diversity:
    """Each value's mean over the groups that have it (every prompt weighs alike)."""
    ratios, distances = [], []
    for group in groups:
        if group.distinct_answer_ratio is not None:
            ratios.append(group.distinct_answer_ratio)
        if group.pairwise_distance is not None:
            distances.append(group.pairwise_distance)
    return Diversity(_mean(ratios), _mean(distances))


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None
