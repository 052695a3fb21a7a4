"""The trainer divides logits by each trajectory's own sampling temperature (0: the run's):
collate keeps it, the policy's log-probs and a reference reset's relabel use it, and a batch
where every row is at the run's temperature is computed exactly as before."""

from __future__ import annotations

import pytest
import torch

from tba.domain import Batch, Prompt, PromptGroup, SampleSource, Trajectory, pack_tokens
from tba.models.logprobs import sequence_logprobs, token_logprobs
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.trainer.collate import collate
from tba.trainer.reference import ReferenceResets
from tba.trainer.step import Scoring, policy_logprobs
from tests.unit.test_trainer_step import tiny_engine

RUN_TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer("0123456789+=")


def two_rows(tokenizer, temperatures: tuple[float, float]) -> Batch:
    """One prompt, two completions, sampled at `temperatures` (0: the run's)."""
    prompt = tokenizer("1+2=").input_ids
    eos = tokenizer.eos_token_id
    rows = [
        Trajectory("p", pack_tokens(prompt), pack_tokens(c), "", 0.0, -3.0, -3.0, 0)
        for c in ([7, eos], [8, 9, eos])
    ]
    for row, t in zip(rows, temperatures, strict=True):
        row.sampling_temperature = t
    return Batch([PromptGroup(Prompt("p", "1+2="), rows, SampleSource.REWARD)], 0)


def alone(model, train, row: int, temperature: float) -> torch.Tensor:
    p, c = train.prompts[row : row + 1], train.completions[row : row + 1]
    return sequence_logprobs(model, p, c, temperature, 0)


def test_rows_without_their_own_take_the_runs_and_none_gives_the_runs_float(tokenizer):
    mixed = collate(two_rows(tokenizer, (0.0, 1.7)))
    assert mixed.sampling_temperature.tolist() == pytest.approx([0.0, 1.7])
    assert mixed.temperatures(RUN_TEMPERATURE).tolist() == pytest.approx([0.7, 1.7])
    assert mixed.select(torch.tensor([1])).sampling_temperature.tolist() == pytest.approx([1.7])
    assert collate(two_rows(tokenizer, (0.0, 0.0))).temperatures(RUN_TEMPERATURE) == 0.7


def test_the_policy_scores_each_row_at_its_own_temperature(tokenizer):
    engine = tiny_engine(tokenizer)
    train = collate(two_rows(tokenizer, (1.7, 0.0)))
    with torch.no_grad():
        both, tokens = policy_logprobs(engine, train, Scoring(RUN_TEMPERATURE, 0))
        want = torch.cat([alone(engine.module, train, 0, 1.7), alone(engine.module, train, 1, 0.7)])
    torch.testing.assert_close(both, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.stack([t.sum() for t in tokens]), want, atol=1e-5, rtol=0)


def test_a_batch_at_the_runs_temperature_is_scored_exactly_as_before(tokenizer):
    engine = tiny_engine(tokenizer)
    train = collate(two_rows(tokenizer, (0.0, 0.0)))
    with torch.no_grad():
        got, _ = policy_logprobs(engine, train, Scoring(RUN_TEMPERATURE, 0))
        before = token_logprobs(
            engine.module, train.prompts, train.completions, RUN_TEMPERATURE, 0
        ).sums()
    assert torch.equal(got, before.float())


def test_a_reset_reference_relabels_each_row_at_its_own_temperature(tokenizer):
    policy = build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2)
    resets = ReferenceResets(
        every_steps=1, temperature=RUN_TEMPERATURE, pad_token_id=0, micro_batch_size=1
    )
    resets.reset(policy)
    train = collate(two_rows(tokenizer, (0.0, 1.3)))
    relabelled = resets.relabel(train)
    with torch.no_grad():
        want = torch.cat([alone(policy, train, 0, 0.7), alone(policy, train, 1, 1.3)])
    torch.testing.assert_close(relabelled.inputs.ref_logprob, want, atol=1e-5, rtol=0)
    sums = torch.stack([t.sum() for t in relabelled.ref_tokens])
    torch.testing.assert_close(sums, want, atol=1e-5, rtol=0)
