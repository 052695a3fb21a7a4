"""One optimizer step's gradients: policy log-probs over micro-batches, the objective, and
backward, so that the accumulated gradient equals that of the whole batch in one pass.

Group constants (log Z, RLOO advantages) need every row of a group. When every group lies
whole in one micro-batch (one process), each micro-batch computes them itself. Otherwise (a
group split across micro-batches, or rows spread over data-parallel ranks) a no-grad pass
first computes the policy log-prob of every row, the ranks exchange them, and the constants
come from the whole batch; the gradient pass then uses those constants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tba.models.logprobs import sequence_logprobs
from tba.trainer.collate import TrainBatch, plan_micro_batches, shard_rows, splits_groups
from tba.trainer.engine import TrainEngine
from tba.trainer.loss import Objective, group_mean

LogprobFn = Callable[[TrainBatch], torch.Tensor]


@dataclass(frozen=True)
class Layout:
    """This rank's rows of the batch, a mask (0 on padding rows) and its micro-batches as
    positions into `rows`."""

    rows: torch.Tensor
    mask: torch.Tensor
    micro_batches: list[torch.Tensor]
    needs_prepass: bool


@dataclass(frozen=True)
class StepResult:
    loss: float
    log_z: float  # mean over groups of the group constant (TB: log Z; RLOO: mean advantage)
    policy_logprob: float  # mean sequence log-prob under the policy
    kl: float  # mean of log pi_theta - log pi_ref per sequence
    rows: int
    micro_batches: int
    prepass: bool


def plan_layout(batch: TrainBatch, micro_batch_size: int, rank: int, world_size: int) -> Layout:
    if world_size == 1:
        plan = plan_micro_batches(batch.inputs.group_index, micro_batch_size)
        rows = torch.arange(batch.size)
        needs_prepass = splits_groups(plan, batch.inputs.group_index)
        return Layout(rows, torch.ones(batch.size), plan, needs_prepass)
    rows, mask = shard_rows(batch.size, rank, world_size)
    positions = torch.arange(rows.numel())
    return Layout(rows, mask, list(torch.split(positions, micro_batch_size)), True)


def policy_logprob_fn(engine: TrainEngine, temperature: float, pad_token_id: int) -> LogprobFn:
    """[n] differentiable policy sequence log-probs of a batch's rows."""

    def logprobs(rows: TrainBatch) -> torch.Tensor:
        with engine.forward_context():
            values = sequence_logprobs(
                engine.module, rows.prompts, rows.completions, temperature, pad_token_id
            )
        return values.float().cpu()

    return logprobs


def accumulate_gradients(
    engine: TrainEngine,
    batch: TrainBatch,
    layout: Layout,
    objective: Objective,
    beta: float,
    logprobs: LogprobFn,
) -> StepResult:
    """Runs forward and backward over this rank's micro-batches (no optimizer step)."""
    n = batch.size
    constants = _batch_constants(engine, batch, layout, objective, beta, logprobs)
    seen = torch.zeros(n)
    sums = torch.zeros(3)  # loss, policy log-prob, kl
    for i, positions in enumerate(layout.micro_batches):
        rows, mask = layout.rows[positions], layout.mask[positions]
        part = batch.select(rows)
        logp = logprobs(part)
        if constants is None:
            local = objective.baselines(logp, part.inputs, beta)
            seen[rows] = local
        else:
            local = constants[rows]
        terms = objective.terms(logp, part.inputs, beta, local) * mask
        # DeepSpeed averages gradients over ranks: scale back up to the full-batch sum.
        engine.backward(
            terms.sum() * (engine.world_size / n), last=i == len(layout.micro_batches) - 1
        )
        lp = logp.detach()
        sums += torch.stack(
            [
                terms.detach().sum() / n,
                (lp * mask).sum(),
                ((lp - part.inputs.ref_logprob) * mask).sum(),
            ]
        )
    sums = engine.all_reduce_sum(sums)
    per_row = constants if constants is not None else seen
    log_z = group_mean(per_row, batch.inputs.group_index, batch.inputs.num_groups).mean()
    return StepResult(
        loss=float(sums[0]),
        log_z=float(log_z),
        policy_logprob=float(sums[1]) / n,
        kl=float(sums[2]) / n,
        rows=n,
        micro_batches=len(layout.micro_batches),
        prepass=layout.needs_prepass,
    )


def _batch_constants(
    engine: TrainEngine,
    batch: TrainBatch,
    layout: Layout,
    objective: Objective,
    beta: float,
    logprobs: LogprobFn,
) -> torch.Tensor | None:
    """[n] group constants from a no-grad pass over the whole batch, or None when each
    micro-batch can compute its own."""
    if not layout.needs_prepass:
        return None
    order = torch.cat(layout.micro_batches)
    with torch.no_grad():
        local = torch.cat([logprobs(batch.select(layout.rows[p])) for p in layout.micro_batches])
    every_logp = engine.all_gather(local)
    every_row = engine.all_gather(layout.rows[order])
    real = engine.all_gather(layout.mask[order]) > 0
    full = torch.zeros(batch.size)
    full[every_row[real]] = every_logp[real]
    return objective.baselines(full, batch.inputs, beta)
