"""Diversity of one prompt's completions, on values worked out by hand: distinct final
answers (the task's own, else the normalised text), token-bigram and embedding distances,
groups of one, and the mean over groups."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.config import Gsm8kSettings
from tba.tasks.diversity import (
    Diversity,
    distinct_answer_ratio,
    final_answer,
    group_diversity,
    jaccard_distance,
    mean_diversity,
    mean_pairwise_cosine_distance,
    mean_pairwise_ngram_distance,
    ngrams,
    normalised_text,
)
from tba.tasks.gsm8k import Gsm8kTask
from tests.fixtures.tiny_models import write_jsonl

# Bigram sets: A {12, 23}, B {12, 24}, C {32, 21}. A and C hold the same tokens in another
# order: distance 1 as bigrams, where unigrams would call them equal.
A, B, C = [1, 2, 3], [1, 2, 4], [3, 2, 1]


def test_ngrams_of_short_and_empty_sequences_are_the_sequence_itself():
    assert ngrams(A) == {(1, 2), (2, 3)}
    assert ngrams(A, n=1) == {(1,), (2,), (3,)}
    assert ngrams([5]) == {(5,)}
    assert ngrams([]) == {()}


def test_jaccard_distance_of_bigram_sets():
    assert jaccard_distance(ngrams(A), ngrams(B)) == pytest.approx(2 / 3)  # 1 shared of 3
    assert jaccard_distance(ngrams(A), ngrams(C)) == 1.0
    assert jaccard_distance(ngrams(A, n=1), ngrams(C, n=1)) == 0.0
    assert jaccard_distance(ngrams([]), ngrams([])) == 0.0
    assert jaccard_distance(ngrams([7]), ngrams([8])) == 1.0


def test_mean_pairwise_ngram_distance():
    # Pairs: AB 2/3, AC 1, BC 1.
    assert mean_pairwise_ngram_distance([A, B, C]) == pytest.approx(8 / 9)
    assert mean_pairwise_ngram_distance([A, A, A]) == 0.0
    assert mean_pairwise_ngram_distance([A]) is None
    assert mean_pairwise_ngram_distance([]) is None


def test_distinct_answer_ratio_counts_no_answer_as_one_answer():
    assert distinct_answer_ratio(["4", "4", "5", None, None]) == pytest.approx(3 / 5)
    assert distinct_answer_ratio(["4", "4"]) == 0.5
    assert distinct_answer_ratio(["a", "b", "c"]) == 1.0
    assert distinct_answer_ratio(["4"]) is None
    assert distinct_answer_ratio([]) is None


def test_the_answer_is_the_tasks_own_else_the_normalised_text(tmp_path: Path):
    assert final_answer(ArithmeticTask(), " 47 \n") == "47"
    rows = [{"question": "How many?", "answer": "6 * 7 = 42\n#### 42"}]
    for split in ("train", "test"):
        write_jsonl(tmp_path / f"{split}.jsonl", rows)
    gsm8k = Gsm8kTask(Gsm8kSettings(source=str(tmp_path)))
    assert final_answer(gsm8k, "It costs $1,200.50 in all.\n#### 1200.50") == "1200.5"
    assert final_answer(gsm8k, "4 + 6 = 10 apples") == "10"
    assert final_answer(gsm8k, "I do not know") is None
    assert final_answer(object(), "  Tell  ME\n now ") == "tell me now"
    assert normalised_text("\tA  b ") == "a b"


def test_a_group_uses_embeddings_when_given_else_bigrams():
    answers = ["x", "y", "x"]
    assert group_diversity(answers, [A, B, C]) == Diversity(
        pytest.approx(2 / 3), pytest.approx(8 / 9)
    )
    # Cosine distances of the pairs: 1, 0, 1.
    embedded = group_diversity(answers, [A, B, C], np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]))
    assert embedded.pairwise_distance == pytest.approx(2 / 3)
    assert group_diversity(["x"], [A]) == Diversity(None, None)
    with pytest.raises(ValueError):
        group_diversity(["x"], [A, B])


def test_the_mean_over_groups_skips_groups_of_one():
    groups = [Diversity(0.5, 0.2), Diversity(None, None), Diversity(1.0, 0.4)]
    assert mean_diversity(groups) == Diversity(0.75, pytest.approx(0.3))
    assert mean_diversity([Diversity(None, None)]) == Diversity(None, None)
    assert mean_diversity([]) == Diversity(None, None)


def brute_force_distance(vectors: np.ndarray) -> float:
    distances = []
    for a, b in itertools.permutations(vectors, 2):
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        cosine = 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))
        distances.append(1.0 - cosine)
    return float(np.mean(distances))


def test_pairwise_cosine_distance_matches_the_definition():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(7, 5)) * rng.uniform(0.1, 10, size=(7, 1))
    vectors[3] = 0.0
    assert mean_pairwise_cosine_distance(vectors) == pytest.approx(brute_force_distance(vectors))


def test_pairwise_cosine_distance_extremes():
    assert mean_pairwise_cosine_distance(np.ones((4, 3))) == pytest.approx(0.0, abs=1e-12)
    assert mean_pairwise_cosine_distance([[1.0, 0.0], [-2.0, 0.0]]) == pytest.approx(2.0)
    assert mean_pairwise_cosine_distance(np.eye(3)) == pytest.approx(1.0)
    assert mean_pairwise_cosine_distance(np.ones((1, 3))) is None
    assert mean_pairwise_cosine_distance(np.ones((0, 3))) is None
