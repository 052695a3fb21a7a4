"""Checks every request before it reaches a store, so bad input changes nothing.
Each check raises InvalidArgumentError (or ResourceExhaustedError for sizes) naming the field."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from tba.buffer.config import BufferSettings
from tba.domain import FinishReason, Prompt, SampleSpec, Trajectory, WeightVersion
from tba.errors import InvalidArgumentError, ResourceExhaustedError

MAX_ID_CHARS = 128
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _fail(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message)


def check_id(value: str, field: str, required: bool = True) -> None:
    if required and not value:
        raise _fail(f"{field} is required")
    if len(value) > MAX_ID_CHARS:
        raise _fail(f"{field} is longer than {MAX_ID_CHARS} characters")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise _fail(f"{field} may not contain spaces or control characters")


def check_finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise _fail(f"{field} must be a finite number, got {value}")


def check_count(value: int, field: str, low: int, high: int) -> None:
    if value < low:
        raise _fail(f"{field} must be at least {low}, got {value}")
    if value > high:
        raise ResourceExhaustedError(f"{field} may be at most {high}, got {value}")


def check_prompts(prompts: Sequence[Prompt], settings: BufferSettings) -> None:
    check_count(len(prompts), "prompts", 1, settings.max_prompts_per_call)
    for i, prompt in enumerate(prompts):
        check_id(prompt.id, f"prompts[{i}].id", required=False)
        if not prompt.text.strip():
            raise _fail(f"prompts[{i}].text is empty")
        for name in ("text", "answer"):
            if len(getattr(prompt, name)) > settings.max_text_chars:
                raise ResourceExhaustedError(
                    f"prompts[{i}].{name} is longer than {settings.max_text_chars} characters"
                )


def check_lease(
    searcher_id: str, max_prompts: int, lease_s: float, settings: BufferSettings
) -> None:
    check_id(searcher_id, "searcher_id")
    check_count(max_prompts, "max_prompts", 1, settings.max_lease_prompts)
    check_finite(lease_s, "lease_s")
    if not 0 <= lease_s <= 86_400:
        raise _fail(f"lease_s must be in [0, 86400] (0: the default), got {lease_s}")


def check_add(
    request_id: str,
    searcher_id: str,
    lease_id: str,
    trajectories: Sequence[Trajectory],
    settings: BufferSettings,
) -> None:
    check_id(request_id, "request_id")
    check_id(searcher_id, "searcher_id")
    check_id(lease_id, "lease_id", required=False)
    check_count(len(trajectories), "trajectories", 1, settings.max_batch_trajectories)
    for i, trajectory in enumerate(trajectories):
        check_trajectory(trajectory, f"trajectories[{i}]", settings)


def check_trajectory(t: Trajectory, where: str, settings: BufferSettings) -> None:
    check_id(t.prompt_id, f"{where}.prompt_id")
    for name in ("reward", "ref_logprob", "behavior_logprob", "created_at_s"):
        check_finite(getattr(t, name), f"{where}.{name}")
    if not t.completion_token_ids:
        raise _fail(f"{where}.completion_token_ids is empty")
    for name in ("prompt_token_ids", "completion_token_ids"):
        if len(getattr(t, name)) % 4:
            raise _fail(f"{where}.{name} must be packed uint32 (a multiple of 4 bytes)")
    if not t.prompt_token_ids:
        raise _fail(f"{where}.prompt_token_ids is empty")
    if len(t.completion_token_ids) // 4 > settings.max_completion_tokens:
        raise ResourceExhaustedError(
            f"{where} has more than {settings.max_completion_tokens} completion tokens"
        )
    if len(t.completion_text) > settings.max_text_chars:
        raise ResourceExhaustedError(f"{where}.completion_text is too long")
    if t.finish_reason not in set(FinishReason):
        raise _fail(f"{where}.finish_reason {t.finish_reason} is not a known value")


def check_sample(spec: SampleSpec, settings: BufferSettings) -> None:
    check_count(spec.num_prompts, "num_prompts", 1, settings.max_sample_groups)
    check_count(spec.samples_per_prompt, "samples_per_prompt", 1, settings.max_samples_per_prompt)
    if not 0.0 <= spec.recency_probability <= 1.0:  # also rejects NaN
        raise _fail(f"recency_probability must be in [0, 1], got {spec.recency_probability}")
    if not spec.reward_temperature > 0:  # inf is allowed: uniform
        raise _fail(f"reward_temperature must be > 0, got {spec.reward_temperature}")
    if not 1 <= spec.min_samples_per_prompt <= spec.samples_per_prompt:
        raise _fail("min_samples_per_prompt must be in [1, samples_per_prompt]")


def check_weights(weights: WeightVersion) -> None:
    if weights.version < 1:
        raise _fail("weights.version must be at least 1")
    if not weights.uri or len(weights.uri) > 4096:
        raise _fail("weights.uri is required (at most 4096 characters)")
    if not _SHA256.match(weights.sha256):
        raise _fail("weights.sha256 must be 64 lowercase hex digits")
    check_finite(weights.published_at_s, "weights.published_at_s")
