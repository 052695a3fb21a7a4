import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tba.buffer import codec
from tba.domain import FinishReason, Prompt, Trajectory, pack_logprobs, pack_tokens

finite = st.floats(allow_nan=False, allow_infinity=False)
ident = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
tokens = st.lists(st.integers(0, 2**32 - 1), max_size=300).map(pack_tokens)
logprobs = st.lists(st.floats(width=32), max_size=300).map(pack_logprobs)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    return Trajectory(
        prompt_id=draw(ident),
        prompt_token_ids=draw(tokens),
        completion_token_ids=draw(tokens),
        completion_text=draw(st.text(st.characters(blacklist_categories=("Cs",)))),
        reward=draw(finite),
        ref_logprob=draw(finite),
        behavior_logprob=draw(finite),
        policy_version=draw(st.integers(-(2**63), 2**63 - 1)),
        searcher_id=draw(ident),
        finish_reason=draw(st.sampled_from(FinishReason)),
        created_at_s=draw(finite),
        behavior_token_logprobs=draw(logprobs),
        ref_token_logprobs=draw(logprobs),
        sampling_temperature=draw(st.just(0.0) | finite),
    )


@given(trajectories(), st.integers(1, 2**53))
def test_trajectory_round_trips_exactly(t: Trajectory, trajectory_id: int) -> None:
    decoded = codec.decode_trajectory(codec.encode_trajectory(t), trajectory_id)
    t.id = trajectory_id
    assert decoded == t


@given(trajectories(), ident)
def test_a_trajectory_encoded_under_another_searcher_is_that_searchers(
    t: Trajectory, searcher_id: str
) -> None:
    blob = codec.encode_trajectory(t, searcher_id)
    assert blob == codec.encode_trajectory(dataclasses.replace(t, searcher_id=searcher_id))
    assert codec.decode_trajectory(blob, 1).searcher_id == searcher_id


def test_trajectory_id_is_not_part_of_the_blob() -> None:
    t = Trajectory("p1", pack_tokens([1]), pack_tokens([2, 3]), "ab", 1.0, -1.0, -2.0, 3)
    t.id = 99
    blob = codec.encode_trajectory(t)
    t.id = 7
    assert codec.encode_trajectory(t) == blob
    assert codec.decode_trajectory(blob, 5).id == 5


def test_token_bytes_are_stored_verbatim() -> None:
    completion = pack_tokens(range(256))
    t = Trajectory("p1", pack_tokens([9, 8]), completion, "x" * 300, 0.5, -1.0, -2.0, 1)
    blob = codec.encode_trajectory(t)
    assert completion in blob
    # header + ids + tokens + text: no per-token overhead
    assert len(blob) < 64 + 2 + 8 + 1024 + 300


def test_corrupt_trajectory_blobs_are_rejected() -> None:
    blob = codec.encode_trajectory(
        Trajectory("p1", pack_tokens([1]), pack_tokens([2]), "ab", 1.0, -1.0, -2.0, 0)
    )
    with pytest.raises(ValueError, match="length"):
        codec.decode_trajectory(blob[:-1], 1)
    with pytest.raises(ValueError, match="length"):
        codec.decode_trajectory(blob + b"x", 1)
    with pytest.raises(ValueError, match="version"):
        codec.decode_trajectory(b"\x09" + blob[1:], 1)
    with pytest.raises(ValueError, match="version"):
        codec.decode_trajectory(b"", 1)


def test_a_trajectory_without_token_logprobs_is_still_a_version_1_blob() -> None:
    """What older searchers send is stored (and its request digested) as before the upgrade."""
    t = Trajectory("p1", pack_tokens([1]), pack_tokens([2, 3]), "ab", 1.0, -1.0, -2.0, 3)
    assert codec.encode_trajectory(t)[0] == 1
    t.ref_token_logprobs = pack_logprobs([-0.25, -0.75])
    assert codec.encode_trajectory(t)[0] == 2


def hand_built(**fields: Any) -> Trajectory:
    """The trajectory the hand-built blobs below hold (id 4), with `fields` set."""
    return Trajectory(
        prompt_id="p1",
        prompt_token_ids=pack_tokens([1, 10]),
        completion_token_ids=pack_tokens([5]),
        completion_text="ok",
        reward=0.5,
        ref_logprob=-3.0,
        behavior_logprob=-2.5,
        policy_version=7,
        searcher_id="s9",
        created_at_s=1_700_000_000.0,
        id=4,
        **fields,
    )


def test_a_version_1_blob_written_before_token_logprobs_still_decodes() -> None:
    # Built by hand in the first format: header, prompt id, searcher id, tokens, text.
    header = struct.pack("<BddddqBHHIII", 1, 0.5, -3.0, -2.5, 1_700_000_000.0, 7, 1, 2, 2, 8, 4, 2)
    blob = header + b"p1" + b"s9" + pack_tokens([1, 10]) + pack_tokens([5]) + b"ok"
    assert codec.decode_trajectory(blob, 4) == hand_built(finish_reason=FinishReason.STOP)


def test_a_sampling_temperature_makes_a_version_3_blob_and_only_it() -> None:
    t = Trajectory("p1", pack_tokens([1]), pack_tokens([2, 3]), "ab", 1.0, -1.0, -2.0, 3)
    without = codec.encode_trajectory(t)
    t.sampling_temperature = 1.25
    blob = codec.encode_trajectory(t)
    assert (without[0], blob[0]) == (1, 3)
    assert codec.decode_trajectory(blob, 1) == dataclasses.replace(t, id=1)
    t.sampling_temperature = 0.0
    assert codec.encode_trajectory(t) == without  # the run's temperature: version 1 as before


def test_a_version_2_blob_written_before_sampling_temperatures_still_decodes() -> None:
    # Built by hand in the second format: the first's, plus the per-token log-probs' lengths
    # in the header and their bytes after the text.
    behavior, ref = pack_logprobs([-2.5]), pack_logprobs([-3.0])
    header = struct.pack(
        "<BddddqBHHIIIII", 2, 0.5, -3.0, -2.5, 1_700_000_000.0, 7, 2, 2, 2, 8, 4, 2, 4, 4
    )
    blob = header + b"p1" + b"s9" + pack_tokens([1, 10]) + pack_tokens([5]) + b"ok" + behavior + ref
    decoded = codec.decode_trajectory(blob, 4)
    assert decoded == hand_built(
        finish_reason=FinishReason.LENGTH, behavior_token_logprobs=behavior, ref_token_logprobs=ref
    )
    assert decoded.sampling_temperature == 0.0  # the run's


def test_a_version_3_blob_carries_the_temperature_in_its_header() -> None:
    # Built by hand: the second format's header with the temperature at its end, no tokens.
    header = struct.pack(
        "<BddddqBHHIIIIId", 3, 0.5, -3.0, -2.5, 1_700_000_000.0, 7, 1, 2, 0, 4, 4, 0, 0, 0, 1.5
    )
    blob = header + b"p1" + pack_tokens([1]) + pack_tokens([5])
    assert codec.encode_trajectory(codec.decode_trajectory(blob, 2)) == blob
    assert codec.decode_trajectory(blob, 2).sampling_temperature == 1.5


def test_token_logprobs_follow_the_text_verbatim() -> None:
    behavior, ref = pack_logprobs([-0.5, -1.5]), pack_logprobs([-0.25, -2.0])
    t = Trajectory("p1", pack_tokens([1]), pack_tokens([2, 3]), "ab", 1.0, -2.25, -2.0, 3)
    t.behavior_token_logprobs, t.ref_token_logprobs = behavior, ref
    blob = codec.encode_trajectory(t)
    assert blob.endswith(b"ab" + behavior + ref)
    decoded = codec.decode_trajectory(blob, 1)
    assert (decoded.behavior_token_logprobs, decoded.ref_token_logprobs) == (behavior, ref)
    with pytest.raises(ValueError, match="length"):
        codec.decode_trajectory(blob[:-4], 1)


@given(ident, st.text(min_size=1), st.text())
def test_prompt_round_trips(prompt_id: str, text: str, answer: str) -> None:
    prompt = Prompt(prompt_id, text, answer)
    assert codec.decode_prompt(prompt_id, codec.encode_prompt(prompt)) == prompt


def test_corrupt_prompt_blobs_are_rejected() -> None:
    blob = codec.encode_prompt(Prompt("p1", "question", "42"))
    with pytest.raises(ValueError, match="shorter"):
        codec.decode_prompt("p1", blob[:7])
    with pytest.raises(ValueError, match="version"):
        codec.decode_prompt("p1", b"\x09" + blob[1:])


def test_digest_tells_completions_apart() -> None:
    a = codec.completion_digest(pack_tokens([1, 2, 3]))
    assert a == codec.completion_digest(pack_tokens([1, 2, 3]))
    assert a != codec.completion_digest(pack_tokens([1, 2, 4]))
    assert a != codec.completion_digest(pack_tokens([1, 2]))
    assert len(a) == 2 * codec.DIGEST_BYTES and " " not in a


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(-5.0, 0), (-1.0, 0), (-0.5, 0), (0.0, 1), (0.25, 1), (0.5, 2), (1.0, 2), (7.0, 2)],
)
def test_reward_bin_is_bisect_right_clamped(reward: float, expected: int) -> None:
    assert codec.reward_bin((-1.0, 0.0, 0.5, 1.0), reward) == expected


@pytest.mark.parametrize(
    ("time_s", "ms"),
    [(0.0, 0), (1.0009, 1000), (-0.0001, -1), (1_700_000_000.5, 1_700_000_000_500)],
)
def test_to_ms_floors(time_s: float, ms: int) -> None:
    assert codec.to_ms(time_s) == ms


def test_new_prompts_come_before_any_lease_in_creation_order() -> None:
    first, second = codec.new_prompt_ms(1), codec.new_prompt_ms(2)
    assert first < second < codec.to_ms(0.0)
    assert float(second) == second  # exact as a Redis score (a double)
