"""Choosing K of a prompt's S completions for contrast (tba.searcher.contrast)."""

from __future__ import annotations

import pytest

from tba.searcher.contrast import contrast_selection


def test_rare_right_answers_are_all_kept_beside_the_wrong_ones():
    rewards = [0.0] * 16
    rewards[5] = rewards[12] = 1.0
    chosen = contrast_selection(rewards, 8)
    assert len(chosen) == 8 and chosen == sorted(chosen)
    assert [rewards[i] for i in chosen].count(1.0) == 2


def test_right_and_wrong_alternate_until_one_kind_runs_out():
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    # Ranked by reward, generation order among equals: 0, 2, 3, 4, 6, 7, 1, 5. Top and bottom
    # in turn: 0, 5, 2, 1; the wrong ones spent, the bottom goes on into the right ones: 3, 7.
    assert contrast_selection(rewards, 6) == [0, 1, 2, 3, 5, 7]
    assert contrast_selection(rewards, 3) == [0, 2, 5]


def test_graded_rewards_keep_both_ends_of_the_ranking():
    rewards = [0.3, 0.9, 0.1, 0.5, 0.7]
    assert contrast_selection(rewards, 2) == [1, 2]
    assert contrast_selection(rewards, 4) == [0, 1, 2, 4]


def test_a_settled_group_keeps_the_first_and_last_generated():
    assert contrast_selection([0.0] * 6, 4) == [0, 1, 4, 5]


def test_a_group_no_larger_than_k_is_kept_whole():
    assert contrast_selection([0.2, 0.1], 8) == [0, 1]
    assert contrast_selection([], 3) == []


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        contrast_selection([1.0], 0)
