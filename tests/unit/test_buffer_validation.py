"""The request checks that keep hostile values away from the stores: bounds that fit the
storage format and Redis's Lua numbers, and text that UTF-8 can carry."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tba.buffer import validation
from tba.buffer.config import BufferSettings
from tba.domain import Prompt, WeightVersion, pack_logprobs
from tba.errors import InvalidArgumentError
from tba.runs import RunIdentity
from tests.fixtures.data import trajectory, with_token_logprobs

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
        ("sampling_temperature", -0.5),
        ("sampling_temperature", 100.5),
        ("sampling_temperature", math.inf),
        ("sampling_temperature", math.nan),
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
    good.sampling_temperature = 100.0
    validation.check_trajectory(good, "t", SETTINGS)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 2.0])
def test_a_sampling_temperature_of_0_or_within_the_settings_bounds_passes(temperature):
    good = dataclasses.replace(trajectory("p1"), sampling_temperature=temperature)
    validation.check_trajectory(good, "t", SETTINGS)


@pytest.mark.parametrize(
    ("low", "high", "fraction"),
    [(0.7, 0.0, 0.5), (0.0, 2.0, 0.5), (2.0, 0.7, 0.5), (0.7, 2.0, 0.0), (0.0, 0.0, 0.5)],
)
def test_a_temperature_range_needs_both_bounds_in_order_and_a_fraction(low, high, fraction):
    identity = RunIdentity(
        temperature=1.0,
        temperature_low=low,
        temperature_high=high,
        temperature_draw_fraction=fraction,
    )
    with pytest.raises(InvalidArgumentError, match=r"identity\.temperature_low"):
        validation.check_identity(identity)


def test_an_identity_with_or_without_a_range_passes():
    validation.check_identity(RunIdentity(temperature=1.0))
    validation.check_identity(
        RunIdentity(
            temperature=1.0,
            temperature_low=0.7,
            temperature_high=2.0,
            temperature_draw_fraction=0.5,
        )
    )


def test_token_logprobs_that_fit_their_completion_pass():
    # Completion (5, 6, 2): three tokens; the sums within float32 rounding of the tokens'.
    good = with_token_logprobs(trajectory("p1"), [-0.5, -1.0, -0.1], [-1.0, -2.0, -0.3])
    validation.check_trajectory(good, "t", SETTINGS)
    validation.check_trajectory(dataclasses.replace(good, ref_token_logprobs=b""), "t", SETTINGS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"behavior_token_logprobs": b"\0" * 10}, "behavior_token_logprobs must be packed float32"),
        ({"ref_token_logprobs": pack_logprobs([-1.0, -2.0])}, "has 2 values for 3 completion"),
        ({"ref_token_logprobs": pack_logprobs([-1.0, -2.0, math.nan])}, "not finite"),
        ({"behavior_token_logprobs": pack_logprobs([-1.0, -math.inf, 0])}, "not finite"),
        # -1.6 is 0.1 away from the tokens' -1.5: past 1e-3 + 1e-4 x 1.5.
        ({"behavior_logprob": -1.6}, r"add up to -1\.5, not t\.behavior_logprob -1\.6 "),
    ],
)
def test_token_logprobs_that_do_not_fit_are_invalid(change, message):
    good = with_token_logprobs(trajectory("p1"), [-0.5, -1.0, 0.0], [-1.0, -2.0, -0.5])
    with pytest.raises(InvalidArgumentError, match=message):
        validation.check_trajectory(dataclasses.replace(good, **change), "t", SETTINGS)


def test_token_logprob_sums_allow_float32_rounding_only():
    tokens = [-0.1] * 500  # each -0.1 rounds in float32; 500 of them add up to about -50.0000007
    good = with_token_logprobs(trajectory("p1", completion=range(500)), tokens, tokens)
    validation.check_trajectory(dataclasses.replace(good, ref_logprob=-50.0), "t", SETTINGS)
    off = dataclasses.replace(good, ref_logprob=-50.01)  # tolerance 1e-3 + 1e-4 x 50
    with pytest.raises(InvalidArgumentError, match="ref_token_logprobs add up to"):
        validation.check_trajectory(off, "t", SETTINGS)


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


# Ids are space-separated fields inside the stores' records.
@pytest.mark.parametrize(
    "bad",
    [" ", "\t", "\n", "\r", "\x00", "\x1f", "\x7f", "\x85", "\xa0", "\u2028", "\u200b", "\u3000"],
)
def test_ids_with_whitespace_or_control_characters_are_invalid(bad):
    with pytest.raises(InvalidArgumentError, match="spaces or control characters"):
        validation.check_id(f"prompt{bad}1", "prompt_id")


@pytest.mark.parametrize("good", ["p-1", "run/42:x", "préfixe_é", "数字", "a" * 128])
def test_printable_ids_without_spaces_pass(good):
    validation.check_id(good, "prompt_id")
