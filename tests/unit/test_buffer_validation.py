"""The request checks that keep hostile values away from the stores: bounds that fit the
storage format and Redis's Lua numbers, and text that UTF-8 can carry."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tba.buffer import validation
from tba.buffer.config import BufferSettings
from tba.domain import Prompt, WeightVersion
from tba.errors import InvalidArgumentError
from tests.fixtures.data import trajectory

SETTINGS = BufferSettings()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("policy_version", 2**53),
        ("policy_version", 2**64 - 1),
        ("policy_version", -1),
        ("reward", 1e300),
        ("reward", math.nan),
        ("ref_logprob", -math.inf),
        ("behavior_logprob", -1e13),
        ("created_at_s", -1.0),
        ("created_at_s", 1e12),
        ("completion_text", "lone \ud800 surrogate"),
    ],
)
def test_out_of_range_trajectory_fields_are_invalid(field, value):
    bad = trajectory("p1")
    setattr(bad, field, value)
    with pytest.raises(InvalidArgumentError, match=field):
        validation.check_trajectory(bad, "t", SETTINGS)


def test_largest_accepted_values_pass():
    good = trajectory("p1", reward=-1e12, policy_version=2**53 - 1, ref_logprob=1e12)
    good.created_at_s = 1e11
    validation.check_trajectory(good, "t", SETTINGS)


@pytest.mark.parametrize(
    "weights",
    [
        WeightVersion(2**53, "file:///w", "a" * 64, 1, 0.0),
        WeightVersion(1, "file:///w", "a" * 64, 2**63, 0.0),
        WeightVersion(1, "file:///w", "a" * 64, 1, -5.0),
        WeightVersion(1, "file:///\udfff", "a" * 64, 1, 0.0),
    ],
)
def test_out_of_range_weights_are_invalid(weights):
    with pytest.raises(InvalidArgumentError, match="weights"):
        validation.check_weights(weights)


@pytest.mark.parametrize("field", ["text", "answer"])
def test_prompt_text_with_a_lone_surrogate_is_invalid(field):
    prompt = dataclasses.replace(Prompt("", "1+1=", "2"), **{field: "\ud800"})
    with pytest.raises(InvalidArgumentError, match=f"prompts\\[0\\].{field}"):
        validation.check_prompts([prompt], SETTINGS)
