"""How stores encode what they keep, shared by both stores so that they agree bit for bit.

A trajectory is one blob: a fixed struct header (format version 3: with the sampling
temperature), then the UTF-8 ids, the packed token bytes, the UTF-8 completion text and
(format versions 2 and 3) the packed per-token log-probs, copied as they are (no per-token
work). Times become integer milliseconds, completions a digest, rewards a histogram bin.
Pure: no I/O.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import math
import struct
from collections.abc import Sequence

from tba.domain import FinishReason, Prompt, Trajectory
from tba.runs import Run, RunIdentity, RunRecipe

# Prompt blobs are still in their first format.
PROMPT_FORMAT_VERSION = 1
# format, reward, ref_logprob, behavior_logprob, created_at_s, policy_version, finish_reason,
# then the byte lengths of prompt_id, searcher_id, prompt tokens, completion tokens, text;
# version 2 adds those of the behaviour and reference per-token log-probs, which follow the
# text; version 3 adds the sampling temperature after them. A trajectory is written in the
# lowest version that holds it: one without per-token log-probs and without a temperature is
# still version 1, so that what an older searcher sends is stored, and digested
# (`request_digest`), byte for byte as before.
_TRAJECTORY_HEADERS = {
    1: struct.Struct("<BddddqBHHIII"),
    2: struct.Struct("<BddddqBHHIIIII"),
    3: struct.Struct("<BddddqBHHIIIIId"),
}
# Byte lengths each version's header holds (its parts), after the 7 fixed fields.
_PART_COUNTS = {1: 5, 2: 7, 3: 7}
_PROMPT_HEADER = struct.Struct("<BI")
DIGEST_BYTES = 16


def _trajectory_version(t: Trajectory) -> int:
    if t.sampling_temperature:
        return 3
    return 2 if t.behavior_token_logprobs or t.ref_token_logprobs else 1


def encode_trajectory(t: Trajectory, searcher_id: str | None = None) -> bytes:
    """The storage blob of `t`, under `searcher_id` when given (a store keeps each trajectory
    under the id of the searcher whose request added it), else `t`'s own; its `id` is not
    part of it (the store keys blobs by id)."""
    version = _trajectory_version(t)
    searcher = t.searcher_id if searcher_id is None else searcher_id
    parts = [t.prompt_id.encode(), searcher.encode(), t.prompt_token_ids]
    parts += [t.completion_token_ids, t.completion_text.encode()]
    if version > 1:
        parts += [t.behavior_token_logprobs, t.ref_token_logprobs]
    temperature = (t.sampling_temperature,) if version == 3 else ()
    header = _TRAJECTORY_HEADERS[version].pack(
        version,
        t.reward,
        t.ref_logprob,
        t.behavior_logprob,
        t.created_at_s,
        t.policy_version,
        int(t.finish_reason),
        *map(len, parts),
        *temperature,
    )
    return b"".join((header, *parts))


def decode_trajectory(blob: bytes, trajectory_id: int) -> Trajectory:
    """The trajectory stored as `blob` (format version 1, 2 or 3) under `trajectory_id`;
    ValueError if it is corrupt."""
    header = _TRAJECTORY_HEADERS.get(blob[0]) if blob else None
    if header is None or len(blob) < header.size:
        raise ValueError(f"trajectory {trajectory_id}: not a version-1, -2 or -3 blob")
    (format_version, reward, ref, behavior, created, version, finish, *rest) = header.unpack_from(
        blob
    )
    lengths = rest[: _PART_COUNTS[format_version]]
    temperature = rest[-1] if format_version == 3 else 0.0
    if header.size + sum(lengths) != len(blob):
        raise ValueError(f"trajectory {trajectory_id}: blob length does not match its header")
    view = memoryview(blob)
    parts = []
    start = header.size
    for length in lengths:
        parts.append(bytes(view[start : start + length]))
        start += length
    prompt_id, searcher_id, prompt_tokens, completion_tokens, text, *token_logprobs = parts
    behavior_tokens, ref_tokens = token_logprobs or (b"", b"")
    return Trajectory(
        prompt_id=prompt_id.decode(),
        prompt_token_ids=prompt_tokens,
        completion_token_ids=completion_tokens,
        completion_text=text.decode(),
        reward=reward,
        ref_logprob=ref,
        behavior_logprob=behavior,
        policy_version=version,
        searcher_id=searcher_id.decode(),
        finish_reason=FinishReason(finish),
        created_at_s=created,
        id=trajectory_id,
        behavior_token_logprobs=behavior_tokens,
        ref_token_logprobs=ref_tokens,
        sampling_temperature=temperature,
    )


def encode_prompt(p: Prompt) -> bytes:
    """The storage blob of a prompt's text and answer (its id is the key)."""
    text = p.text.encode()
    header = _PROMPT_HEADER.pack(PROMPT_FORMAT_VERSION, len(text))
    return b"".join((header, text, p.answer.encode()))


def decode_prompt(prompt_id: str, blob: bytes) -> Prompt:
    if len(blob) < _PROMPT_HEADER.size or blob[0] != PROMPT_FORMAT_VERSION:
        raise ValueError(f"prompt {prompt_id}: not a version-{PROMPT_FORMAT_VERSION} blob")
    _, text_len = _PROMPT_HEADER.unpack_from(blob)
    start = _PROMPT_HEADER.size
    if start + text_len > len(blob):
        raise ValueError(f"prompt {prompt_id}: blob is shorter than its header says")
    text = blob[start : start + text_len].decode()
    return Prompt(id=prompt_id, text=text, answer=blob[start + text_len :].decode())


def completion_digest(completion_token_ids: bytes) -> str:
    """Identifies a completion for de-duplication within its prompt (128 bits, hex)."""
    return hashlib.blake2b(completion_token_ids, digest_size=DIGEST_BYTES).hexdigest()


def request_digest(searcher_id: str, lease_id: str, trajectories: Sequence[Trajectory]) -> str:
    """Identifies what an AddTrajectories request carries, as the client sent it, so that a
    request id reused for another batch is told from a retry (128 bits, hex)."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    parts = [searcher_id.encode(), lease_id.encode(), *map(encode_trajectory, trajectories)]
    for part in parts:  # length-prefixed, so that no two requests share a byte stream
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def to_ms(time_s: float) -> int:
    """Store time: integer milliseconds, so both stores order and compare times alike."""
    return math.floor(time_s * 1000)


def reward_bin(edges: Sequence[float], reward: float) -> int:
    """Histogram bin of `reward`: bisect_right(edges, r) - 1, clamped to the outer bins."""
    return min(max(bisect.bisect_right(edges, reward) - 1, 0), len(edges) - 2)


# New prompts enter the pool at "available since" this far before the epoch plus their
# creation sequence number: ahead of every prompt ever leased, in the order they came.
NEW_PROMPT_MS_BASE = -(2**50)


def new_prompt_ms(sequence: int) -> int:
    return NEW_PROMPT_MS_BASE + sequence


def encode_run(run: Run) -> str:
    """A run as JSON (the Redis store keeps it as one string)."""
    return json.dumps(dataclasses.asdict(run), sort_keys=True)


def decode_run(text: str | bytes) -> Run:
    data = json.loads(text)
    return Run(
        run_id=data["run_id"],
        identity=RunIdentity(**data["identity"]),
        recipe=RunRecipe(**data["recipe"]),
        registered_at_s=data["registered_at_s"],
    )
