"""Checks every request before it reaches a store, so bad input changes nothing.
Each check raises InvalidArgumentError (or ResourceExhaustedError for sizes) naming the field."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from tba.buffer.config import BufferSettings
from tba.buffer.history import Evaluation
from tba.domain import (
    MAX_SAMPLING_TEMPERATURE,
    FinishReason,
    Prompt,
    SampleSpec,
    Trajectory,
    WeightVersion,
    unpack_logprobs,
)
from tba.errors import InvalidArgumentError, ResourceExhaustedError
from tba.runs import Run, RunIdentity

MAX_ID_CHARS = 128
# Versions and steps stay exact as doubles (Redis's Lua compares them as numbers).
MAX_VERSION = 2**53 - 1
# Rewards and log-probs beyond this are errors upstream; the bound keeps sums in stats finite.
MAX_ABS_VALUE = 1e12
# Per-token log-probs must add up to their sequence sum within this many nats plus
# TOKEN_SUM_RELATIVE of the sum of their magnitudes: room for float32 rounding (the tokens are
# float32, engines add them in float32 or float64), not for a missing or a foreign token.
TOKEN_SUM_ABSOLUTE = 1e-3
TOKEN_SUM_RELATIVE = 1e-4
# Seconds since the epoch, up to the year 5138.
MAX_TIME_S = 1e11
# Metrics one evaluation may carry (accuracy, pass@k, ...).
MAX_EVALUATION_METRICS = 32
# A model source is a hub name or a directory path.
MAX_SOURCE_CHARS = 4096
# A registered run knows all of these; model_revision may be empty (a hub model loaded
# without a commit hash).
_REQUIRED_IDENTITY = (
    "model_source",
    "tokenizer_sha256",
    "task_name",
    "prompt_template_sha256",
    "temperature",
    "max_new_tokens",
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FINISH_REASONS = frozenset(FinishReason)


def _fail(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message)


def check_id(value: str, field: str, required: bool = True) -> None:
    if required and not value:
        raise _fail(f"{field} is required")
    if len(value) > MAX_ID_CHARS:
        raise _fail(f"{field} is longer than {MAX_ID_CHARS} characters")
    # str.isprintable is false for every whitespace character but " ": the same test as
    # each character's isspace() and isprintable(), without a Python step per character.
    if not value.isprintable() or " " in value:
        raise _fail(f"{field} may not contain spaces or control characters")


def check_finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise _fail(f"{field} must be a finite number, got {value}")


def check_text(value: str, field: str) -> None:
    """Text reaches stores and replies as UTF-8; JSON can carry what UTF-8 cannot."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise _fail(f"{field} is not valid Unicode text (it holds a lone surrogate)") from exc


def check_bounded(value: float, field: str, low: float, high: float) -> None:
    check_finite(value, field)
    if not low <= value <= high:
        raise _fail(f"{field} must be in [{low:g}, {high:g}], got {value:g}")


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
            check_text(getattr(prompt, name), f"prompts[{i}].{name}")


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
    run_id: str = "",
) -> None:
    check_id(request_id, "request_id")
    check_id(searcher_id, "searcher_id")
    check_id(lease_id, "lease_id", required=False)
    check_id(run_id, "run_id", required=False)
    check_count(len(trajectories), "trajectories", 1, settings.max_batch_trajectories)
    for i, trajectory in enumerate(trajectories):
        check_trajectory(trajectory, f"trajectories[{i}]", settings)


def check_trajectory(t: Trajectory, where: str, settings: BufferSettings) -> None:
    check_id(t.prompt_id, f"{where}.prompt_id")
    for name in ("reward", "ref_logprob", "behavior_logprob"):
        check_bounded(getattr(t, name), f"{where}.{name}", -MAX_ABS_VALUE, MAX_ABS_VALUE)
    check_bounded(t.created_at_s, f"{where}.created_at_s", 0, MAX_TIME_S)
    check_bounded(t.policy_version, f"{where}.policy_version", 0, MAX_VERSION)
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
    check_text(t.completion_text, f"{where}.completion_text")
    if t.finish_reason not in _FINISH_REASONS:
        raise _fail(f"{where}.finish_reason {t.finish_reason} is not a known value")
    check_sampling_temperature(t.sampling_temperature, f"{where}.sampling_temperature")
    tokens = len(t.completion_token_ids) // 4
    check_token_logprobs(t.behavior_token_logprobs, t.behavior_logprob, tokens, where, "behavior")
    check_token_logprobs(t.ref_token_logprobs, t.ref_logprob, tokens, where, "ref")


def check_sampling_temperature(value: float, field: str) -> None:
    """0 (not set: the run's temperature), or a temperature a searcher's settings allow."""
    check_finite(value, field)
    if not (value == 0 or 0 < value <= MAX_SAMPLING_TEMPERATURE):
        raise _fail(
            f"{field} must be 0 (the run's) or in (0, {MAX_SAMPLING_TEMPERATURE:g}], got {value:g}"
        )


def check_token_logprobs(packed: bytes, total: float, tokens: int, where: str, kind: str) -> None:
    """Per-token log-probs, when given (empty: not sent): packed float32, one per completion
    token, finite, adding up to the sequence sum `{kind}_logprob`."""
    if not packed:
        return
    field = f"{where}.{kind}_token_logprobs"
    if len(packed) % 4:
        raise _fail(f"{field} must be packed float32 (a multiple of 4 bytes)")
    values = unpack_logprobs(packed).astype(np.float64)
    if len(values) != tokens:
        raise _fail(f"{field} has {len(values)} values for {tokens} completion tokens")
    if not np.isfinite(values).all():
        raise _fail(f"{field} holds a value that is not finite")
    tolerance = TOKEN_SUM_ABSOLUTE + TOKEN_SUM_RELATIVE * float(np.abs(values).sum())
    if abs(float(values.sum()) - total) > tolerance:
        raise _fail(
            f"{field} add up to {values.sum():.6g}, not {where}.{kind}_logprob {total:.6g} "
            f"(tolerance {TOKEN_SUM_ABSOLUTE:g} + {TOKEN_SUM_RELATIVE:g} x the sum of their "
            "magnitudes)"
        )


def check_sample(spec: SampleSpec, settings: BufferSettings) -> None:
    check_count(spec.num_prompts, "num_prompts", 1, settings.max_sample_groups)
    check_count(spec.samples_per_prompt, "samples_per_prompt", 1, settings.max_samples_per_prompt)
    if not 0.0 <= spec.recency_probability <= 1.0:  # also rejects NaN
        raise _fail(f"recency_probability must be in [0, 1], got {spec.recency_probability}")
    if not spec.reward_temperature > 0:  # inf is allowed: uniform
        raise _fail(f"reward_temperature must be > 0, got {spec.reward_temperature}")
    if not 1 <= spec.min_samples_per_prompt <= spec.samples_per_prompt:
        raise _fail("min_samples_per_prompt must be in [1, samples_per_prompt]")
    if spec.min_groups > spec.num_prompts:
        raise _fail(f"min_groups must be at most num_prompts, got {spec.min_groups}")
    if not 0.0 <= spec.wait_s <= settings.max_sample_wait_s:  # also rejects NaN
        raise _fail(f"wait_s must be in [0, {settings.max_sample_wait_s:g}], got {spec.wait_s}")


def check_weights_wait(newer_than: int, wait_s: float, settings: BufferSettings) -> None:
    check_bounded(newer_than, "newer_than", 0, MAX_VERSION)
    if not 0.0 <= wait_s <= settings.max_weights_wait_s:  # also rejects NaN
        raise _fail(f"wait_s must be in [0, {settings.max_weights_wait_s:g}], got {wait_s}")


def check_weights(weights: WeightVersion) -> None:
    check_bounded(weights.version, "weights.version", 1, MAX_VERSION)
    check_bounded(weights.step, "weights.step", 0, MAX_VERSION)
    if not weights.uri or len(weights.uri) > 4096:
        raise _fail("weights.uri is required (at most 4096 characters)")
    check_text(weights.uri, "weights.uri")
    if not _SHA256.match(weights.sha256):
        raise _fail("weights.sha256 must be 64 lowercase hex digits")
    check_bounded(weights.published_at_s, "weights.published_at_s", 0, MAX_TIME_S)


def check_evaluation(evaluation: Evaluation) -> None:
    check_bounded(evaluation.version, "version", 0, MAX_VERSION)
    check_bounded(evaluation.step, "step", 0, MAX_VERSION)
    if not 1 <= len(evaluation.metrics) <= MAX_EVALUATION_METRICS:
        raise _fail(f"metrics must hold 1 to {MAX_EVALUATION_METRICS} values")
    for name, value in evaluation.metrics.items():
        check_id(name, "metric name")
        check_bounded(value, f"metrics[{name!r}]", -MAX_ABS_VALUE, MAX_ABS_VALUE)


def check_identity(identity: RunIdentity) -> None:
    """Each field within bounds; empty or zero ones are unknown (a joining searcher's)."""
    for name in ("model_source", "model_revision", "tokenizer_sha256", "task_name"):
        check_text(getattr(identity, name), f"identity.{name}")
    check_count(len(identity.model_source), "identity.model_source", 0, MAX_SOURCE_CHARS)
    for name in ("model_revision", "tokenizer_sha256", "task_name", "prompt_template_sha256"):
        check_id(getattr(identity, name), f"identity.{name}", required=False)
    for name in ("temperature", "temperature_low", "temperature_high"):
        check_bounded(getattr(identity, name), f"identity.{name}", 0.0, MAX_SAMPLING_TEMPERATURE)
    check_count(identity.max_new_tokens, "identity.max_new_tokens", 0, 2**31 - 1)
    check_temperature_range(identity)


def check_temperature_range(identity: RunIdentity) -> None:
    """A range has both bounds (low <= high) and a fraction in (0, 1]; no range, none."""
    low, high = identity.temperature_low, identity.temperature_high
    fraction = identity.temperature_draw_fraction
    check_bounded(fraction, "identity.temperature_draw_fraction", 0.0, 1.0)
    if not low and not high and not fraction:
        return
    if not (0 < low <= high and fraction > 0):
        raise _fail(
            "identity.temperature_low, temperature_high and temperature_draw_fraction must be "
            f"all 0 (no range) or 0 < low <= high with a fraction > 0, got {low:g}, {high:g}, "
            f"{fraction:g}"
        )


def check_run(run: Run, settings: BufferSettings) -> None:
    """A run to register: an id and every identity field known."""
    check_id(run.run_id, "run.run_id")
    check_identity(run.identity)
    missing = [name for name in _REQUIRED_IDENTITY if not getattr(run.identity, name)]
    if missing:
        raise _fail(f"run.identity lacks {', '.join(missing)}")
    for name in ("task_json", "model_json"):
        text = getattr(run.recipe, name)
        check_text(text, f"run.recipe.{name}")
        check_count(len(text), f"run.recipe.{name}", 2, settings.max_text_chars)
    check_count(run.recipe.model_seed, "run.recipe.model_seed", 0, MAX_VERSION)
