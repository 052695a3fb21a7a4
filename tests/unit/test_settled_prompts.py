"""Passing over settled prompts (tba.searcher.settled): which prompts a round generates for,
and for how many leases a settled one is passed over."""

from __future__ import annotations

import pytest

from tba.searcher.settled import SettledPrompts
from tba.tasks.base import make_prompt

PROMPTS = [make_prompt("arithmetic", f"{a}+1=", str(a + 1)) for a in range(10, 16)]


def ids(prompts):
    return [p.id for p in prompts]


def test_a_round_leases_one_more_round_of_prompts_per_pass():
    assert SettledPrompts(3).lease_size(16) == 64
    assert SettledPrompts(1).lease_size(5) == 10


def test_a_prompt_whose_group_got_one_reward_is_passed_over_at_its_next_leases():
    settled = SettledPrompts(2)
    first, second = PROMPTS[0].id, PROMPTS[1].id
    settled.record([(first, [1.0, 1.0, 1.0]), (second, [0.0, 1.0, 0.0])])
    chosen, passed = settled.choose(PROMPTS, 2)
    assert ids(chosen) == ids(PROMPTS[1:3]) and passed == 1
    chosen, passed = settled.choose(PROMPTS, 2)
    assert ids(chosen) == ids(PROMPTS[1:3]) and passed == 1
    # Its two passes are used up: it is generated for again.
    chosen, passed = settled.choose(PROMPTS, 2)
    assert ids(chosen) == ids(PROMPTS[:2]) and passed == 0
    assert len(settled) == 0


def test_all_wrong_settles_too_and_a_mixed_group_makes_a_prompt_count_again():
    settled = SettledPrompts(5)
    settled.record([(PROMPTS[0].id, [0.0, 0.0]), (PROMPTS[1].id, [0.5])])
    assert len(settled) == 2
    settled.record([(PROMPTS[0].id, [0.0, 1.0])])
    chosen, passed = settled.choose(PROMPTS, 3)
    assert ids(chosen) == [PROMPTS[0].id, PROMPTS[2].id, PROMPTS[3].id] and passed == 1


def test_only_the_prompts_looked_at_use_up_a_pass():
    settled = SettledPrompts(1)
    settled.record([(PROMPTS[3].id, [1.0, 1.0])])
    chosen, passed = settled.choose(PROMPTS, 2)
    assert ids(chosen) == ids(PROMPTS[:2]) and passed == 0
    assert len(settled) == 1


def test_a_lease_with_too_few_unsettled_prompts_is_topped_up_in_lease_order():
    settled = SettledPrompts(3)
    settled.record([(p.id, [1.0, 1.0]) for p in PROMPTS[:4]])
    chosen, passed = settled.choose(PROMPTS, 4)
    assert ids(chosen) == [PROMPTS[4].id, PROMPTS[5].id, PROMPTS[0].id, PROMPTS[1].id]
    assert passed == 2


def test_the_oldest_settled_prompts_are_forgotten_past_the_bound():
    settled = SettledPrompts(1, max_remembered=2)
    settled.record([(p.id, [1.0, 1.0]) for p in PROMPTS[:3]])
    assert len(settled) == 2
    chosen, passed = settled.choose(PROMPTS[:3], 1)
    assert ids(chosen) == [PROMPTS[0].id] and passed == 0


def test_passes_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        SettledPrompts(0)
