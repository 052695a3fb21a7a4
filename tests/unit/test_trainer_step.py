"""Micro-batching and gradient accumulation give the full-batch gradient, whatever the layout;
on on-policy data the TB gradient is mean-baseline REINFORCE with the KL in the reward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tba.models.logprobs import sequence_logprobs, token_logprobs
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.trainer.collate import TrainBatch
from tba.trainer.config import OptimSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.loss import ImportanceClip, LossInputs, Objective, Rloo, TrajectoryBalance
from tba.trainer.objectives import Grpo, OnlineDpo
from tba.trainer.step import Scoring, accumulate_gradients, plan_layout, policy_logprobs

TEMPERATURE = 0.7
SCORING = Scoring(TEMPERATURE, pad_token_id=0)
SIZES = [3, 2, 4, 1]  # the buffer dedups, so groups differ in size


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer("0123456789+=")


def tiny_engine(tokenizer) -> LocalEngine:
    model = build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2, seed=1)
    return LocalEngine(model, OptimSettings(lr=1e-3), total_steps=10)


def make_batch(tokenizer, engine: LocalEngine, on_policy: bool) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    prompts, completions, groups = [], [], []
    for g, size in enumerate(SIZES):
        prompt = tokenizer(f"{g}+{g + 1}=").input_ids
        for _ in range(size):
            length = int(torch.randint(1, 5, (1,), generator=gen))
            completion = torch.randint(4, len(tokenizer), (length,), generator=gen).tolist()
            prompts.append(prompt)
            completions.append([*completion, tokenizer.eos_token_id])
            groups.append(g)
    n = len(groups)
    with torch.no_grad():
        current = sequence_logprobs(
            engine.module, prompts, completions, TEMPERATURE, tokenizer.pad_token_id
        )
    ref = current - torch.rand(n, generator=gen)
    behavior = current if on_policy else current + torch.randn(n, generator=gen)
    reward = (torch.rand(n, generator=gen) > 0.5).float()
    inputs = LossInputs(ref, behavior, reward, torch.tensor(groups), len(SIZES))
    # Per-token log-probs: the behaviour's spread over each row's tokens, the reference's
    # the policy's own minus 0.1 a token.
    with torch.no_grad():
        scored = token_logprobs(
            engine.module, prompts, completions, TEMPERATURE, tokenizer.pad_token_id
        ).per_row()
    behavior_tokens = [
        torch.full((len(c),), float(b) / len(c)) for c, b in zip(completions, behavior, strict=True)
    ]
    ref_tokens = [t.float() - 0.1 for t in scored]
    versions = torch.zeros(n, dtype=torch.long)
    return TrainBatch(
        prompts, completions, inputs, versions, 0, behavior_tokens, ref_tokens, torch.zeros(n)
    )


def gradient(engine: LocalEngine, batch: TrainBatch, objective: Objective, micro: int):
    engine.optimizer.zero_grad(set_to_none=True)
    layout = plan_layout(batch, micro, rank=0, world_size=1)
    clip = getattr(objective, "clip", None)
    token_clip = clip if clip is not None and clip.level == "token" else None
    scoring = Scoring(TEMPERATURE, 0, token_clip)
    result = accumulate_gradients(engine, batch, layout, objective, 0.1, scoring)
    grads = [p.grad.clone() for p in engine.module.parameters() if p.grad is not None]
    return result, grads


@pytest.mark.parametrize(
    "objective",
    [
        TrajectoryBalance(),
        TrajectoryBalance(ImportanceClip(0.2, 1.5)),
        TrajectoryBalance(ImportanceClip(0.2, 1.5, "token")),
        Rloo(),
        Grpo(0.2),
        OnlineDpo(),
    ],
    ids=["tb", "tb-importance", "tb-token-importance", "rloo", "grpo", "online_dpo"],
)
def test_any_micro_batch_layout_gives_the_full_batch_gradient(tokenizer, objective):
    engine = tiny_engine(tokenizer)
    batch = make_batch(tokenizer, engine, on_policy=False)
    full, full_grads = gradient(engine, batch, objective, micro=batch.size)
    assert not full.prepass and full.micro_batches == 1
    assert any(g.abs().sum() > 0 for g in full_grads)
    for micro in (4, 3, 1):  # 4: whole groups per micro-batch; 3 and 1 split groups
        result, grads = gradient(engine, batch, objective, micro)
        assert result.prepass == (micro != 4)
        # abs: GRPO's loss is a near-cancelling sum of unit-size terms (float32 rounding).
        assert result.loss == pytest.approx(full.loss, rel=1e-5, abs=1e-6)
        assert result.baseline_mean == pytest.approx(full.baseline_mean, rel=1e-5, abs=1e-6)
        for a, b in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_kl_token_mean_is_over_the_tokens_of_rows_with_reference_tokens(tokenizer):
    engine = tiny_engine(tokenizer)
    batch = make_batch(tokenizer, engine, on_policy=True)
    result, _ = gradient(engine, batch, TrajectoryBalance(), micro=3)
    # Every stored reference token is the policy's own minus 0.1 (no step taken yet).
    assert result.kl_token_mean == pytest.approx(0.1, abs=1e-5)
    # Rows without reference tokens (older searchers) do not count; none at all: no metric.
    half = [t if i % 2 else torch.zeros(0) for i, t in enumerate(batch.ref_tokens)]
    half[1] = half[1] - 1.0  # this row's tokens now differ by 1.1 each
    tb = TrajectoryBalance()
    partial, _ = gradient(engine, dataclasses.replace(batch, ref_tokens=half), tb, micro=3)
    tokens = [len(t) for t in half]
    expected = (0.1 * sum(tokens) + 1.0 * tokens[1]) / sum(tokens)
    assert partial.kl_token_mean == pytest.approx(expected, abs=1e-5)
    none = [torch.zeros(0)] * batch.size
    bare, _ = gradient(engine, dataclasses.replace(batch, ref_tokens=none), tb, micro=3)
    assert bare.kl_token_mean is None
    assert bare.loss == pytest.approx(result.loss)


def test_on_policy_tb_gradient_is_kl_regularised_reinforce(tokenizer):
    engine = tiny_engine(tokenizer)
    batch = make_batch(tokenizer, engine, on_policy=True)
    beta = 0.1
    _, tb_grads = gradient(engine, batch, TrajectoryBalance(), micro=3)

    engine.optimizer.zero_grad(set_to_none=True)
    logp, _ = policy_logprobs(engine, batch, SCORING)
    x = batch.inputs
    shaped = x.reward - beta * (logp.detach() - x.ref_logprob)
    baseline = torch.stack([shaped[x.group_index == g].mean() for g in x.group_index])
    surrogate = -(2 / (beta * batch.size)) * ((shaped - baseline) * logp).sum()
    surrogate.backward()
    for a, p in zip(tb_grads, engine.module.parameters(), strict=True):
        assert p.grad is not None
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def test_gradient_checkpointing_gives_the_same_gradient(tokenizer):
    plain = tiny_engine(tokenizer)
    batch = make_batch(tokenizer, plain, on_policy=False)
    _, expected = gradient(plain, batch, TrajectoryBalance(), micro=3)
    checkpointed = tiny_engine(tokenizer)
    checkpointed.model.gradient_checkpointing_enable()
    checkpointed.model.config.use_cache = False
    checkpointed.model.train()
    _, grads = gradient(checkpointed, batch, TrajectoryBalance(), micro=3)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_trains_close_to_fp32(tokenizer):
    full = tiny_engine(tokenizer)
    batch = make_batch(tokenizer, full, on_policy=False)
    expected, _ = gradient(full, batch, TrajectoryBalance(), micro=4)
    half = tiny_engine(tokenizer)
    half.bf16 = True
    result, grads = gradient(half, batch, TrajectoryBalance(), micro=4)
    assert result.loss == pytest.approx(expected.loss, rel=0.05)
    assert result.loss != expected.loss  # the forward really ran in bfloat16
    assert all(g.dtype == torch.float32 for g in grads)  # fp32 master weights
    assert half.step() > 0
