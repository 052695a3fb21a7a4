"""The run's identity: which fields differ, and when a trainer, a searcher or a batch of
trajectories is refused."""

from __future__ import annotations

import dataclasses

import pytest

from tba.errors import FailedPreconditionError
from tba.runs import (
    Run,
    RunIdentity,
    check_joins,
    check_registers,
    check_tagged,
    combined,
    differences,
    generation_identity,
    prompt_template_sha256,
)
from tba.tasks.config import Gsm8kSettings, TaskSettings

IDENTITY = RunIdentity("tiny", "sha256:" + "0" * 64, "t" * 64, "arithmetic", "p" * 64, 1.0, 5)
RUN = Run("r1", IDENTITY)


def test_identical_identities_have_no_differences() -> None:
    assert differences(IDENTITY, IDENTITY) == []


def test_each_differing_field_is_named_with_both_values() -> None:
    other = dataclasses.replace(IDENTITY, task_name="gsm8k", temperature=0.7)
    found = differences(IDENTITY, other)
    assert found == [
        "task_name: the run has 'arithmetic', this has 'gsm8k'",
        "temperature: the run has 1.0, this has 0.7",
    ]


def test_fields_the_candidate_does_not_know_are_not_compared() -> None:
    assert differences(IDENTITY, RunIdentity(task_name="arithmetic", max_new_tokens=5)) == []
    assert differences(IDENTITY, RunIdentity()) == []
    assert differences(IDENTITY, RunIdentity(max_new_tokens=6)) == [
        "max_new_tokens: the run has 5, this has 6"
    ]


def test_a_contradicting_searcher_is_refused_naming_the_field() -> None:
    check_joins(RUN, RunIdentity(task_name="arithmetic"), "searcher s1")
    with pytest.raises(FailedPreconditionError, match=r"searcher s1 .* run r1: tokenizer_sha256"):
        check_joins(RUN, RunIdentity(tokenizer_sha256="x" * 64), "searcher s1")


def test_the_same_run_may_register_again_and_no_other() -> None:
    check_registers(RUN, RUN)
    with pytest.raises(
        FailedPreconditionError,
        match=r"resuming run r1 contradicts the buffer.s run r1: model_source",
    ):
        check_registers(RUN, Run("r1", dataclasses.replace(IDENTITY, model_source="gpt2")))
    with pytest.raises(FailedPreconditionError, match=r"run r2 is another run .*same identity"):
        check_registers(RUN, Run("r2", IDENTITY))
    with pytest.raises(FailedPreconditionError, match="task_name: the run has 'arithmetic'"):
        check_registers(RUN, Run("r2", dataclasses.replace(IDENTITY, task_name="gsm8k")))


def test_trajectories_must_carry_the_registered_run() -> None:
    check_tagged("", "")
    check_tagged("r1", "r1")
    with pytest.raises(FailedPreconditionError, match="no run registered"):
        check_tagged("", "r1")
    with pytest.raises(FailedPreconditionError, match="untagged batch"):
        check_tagged("r1", "")
    with pytest.raises(FailedPreconditionError, match="run r2, but the buffer serves run r1"):
        check_tagged("r1", "r2")


def test_the_prompt_template_hash_follows_the_prompt_shaping_settings_only() -> None:
    gsm8k = TaskSettings(name="gsm8k")
    same_prompts = TaskSettings(name="gsm8k", gsm8k=Gsm8kSettings(limit=3))
    other_template = TaskSettings(name="gsm8k", gsm8k=Gsm8kSettings(template="Q: {question}"))
    assert prompt_template_sha256(gsm8k) == prompt_template_sha256(same_prompts)
    assert prompt_template_sha256(gsm8k) != prompt_template_sha256(other_template)
    assert prompt_template_sha256(gsm8k) != prompt_template_sha256(TaskSettings())
    assert len(prompt_template_sha256(TaskSettings(name="unknown"))) == 64


def test_an_identity_combines_from_the_parts_that_know_its_fields() -> None:
    model = RunIdentity(model_source="tiny", model_revision="sha256:0", tokenizer_sha256="t")
    task = TaskSettings(name="gsm8k")
    generation = generation_identity(task, 0.7, 32)
    whole = combined(model, generation)
    assert (whole.model_source, whole.task_name, whole.max_new_tokens) == ("tiny", "gsm8k", 32)
    assert whole.prompt_template_sha256 == prompt_template_sha256(task)
    assert combined(whole, RunIdentity(temperature=1.0)).temperature == 1.0


RANGED = dataclasses.replace(
    IDENTITY, temperature_low=0.7, temperature_high=2.0, temperature_draw_fraction=0.5
)


def test_an_identity_from_before_the_range_equals_one_with_the_range_unset() -> None:
    before = RunIdentity("tiny", "sha256:" + "0" * 64, "t" * 64, "arithmetic", "p" * 64, 1.0, 5)
    task = TaskSettings(name="arithmetic")
    assert before == IDENTITY
    assert generation_identity(task, 1.0, 5) == generation_identity(task, 1.0, 5, None)
    assert (IDENTITY.temperature_low, IDENTITY.temperature_draw_fraction) == (0.0, 0.0)


def test_a_searcher_whose_range_differs_from_the_runs_is_refused_naming_the_field() -> None:
    other = dataclasses.replace(RANGED, temperature_high=1.5)
    with pytest.raises(FailedPreconditionError, match=r"temperature_high: the run has 2\.0"):
        check_joins(Run("r1", RANGED), other, "searcher s1")
    with pytest.raises(FailedPreconditionError, match=r"temperature_low: the run has 0\.0"):
        check_joins(RUN, RANGED, "searcher s1")
    # A searcher without a range knows none: it takes the run's (searcher.joining).
    check_joins(Run("r1", RANGED), IDENTITY, "searcher s1")


def test_the_range_enters_the_generation_identity() -> None:
    identity = generation_identity(TaskSettings(name="arithmetic"), 1.0, 5, (0.7, 2.0, 0.5))
    assert (identity.temperature_low, identity.temperature_high) == (0.7, 2.0)
    assert identity.temperature_draw_fraction == 0.5
