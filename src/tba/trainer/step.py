"""One optimizer step on a drawn batch, read top to bottom in `train_on_batch`:

    collate -> reference log-probs -> micro-batch layout -> [group constants first] ->
    per micro-batch: policy log-probs, loss terms, backward -> clip + optimizer step ->
    reference reset

and `step_metrics`, what the loop logs of it. The loss is pure (`trainer.loss`); the engine
(`trainer.engine`) owns forward contexts, backward, clipping, the optimizer and collectives.

The accumulated gradient equals that of the whole batch in one pass. Group constants (log Z,
RLOO and GRPO advantages, online DPO's pair losses) need every row of a group. When every
group lies whole in one micro-batch (one process), each micro-batch computes them itself.
Otherwise (a group split across micro-batches, or rows spread over data-parallel ranks) a
no-grad pass first computes the policy log-prob of every row, the ranks exchange them, and
the constants come from the whole batch; the gradient pass then uses those constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tba.domain import Batch
from tba.models.logprobs import token_logprobs
from tba.trainer.collate import TrainBatch, collate, plan_micro_batches, shard_rows, splits_groups
from tba.trainer.engine import TrainEngine
from tba.trainer.loss import ImportanceClip, Objective, group_mean
from tba.trainer.objectives import reward_spread_groups
from tba.trainer.optim import RewardDecay
from tba.trainer.reference import ReferenceResets
from tba.trainer.tokens import require_behavior_tokens, token_importance_weights, token_kl_sums


@dataclass(frozen=True)
class Scoring:
    """How the policy scores rows: sequence log-probs of logits / `temperature` (the run's
    sampling temperature, for rows without their own: `TrainBatch.temperatures`),
    micro-batches padded with `pad_token_id`; with `token_clip`, importance weights from
    per-token ratios (`tba.trainer.tokens`)."""

    temperature: float
    pad_token_id: int
    token_clip: ImportanceClip | None = None


@dataclass(frozen=True)
class Layout:
    """This rank's rows of the batch, a mask (0 on padding rows) and its micro-batches as
    positions into `rows`."""

    rows: torch.Tensor
    mask: torch.Tensor
    micro_batches: list[torch.Tensor]
    needs_prepass: bool


@dataclass(frozen=True)
class Gradients:
    """What accumulating one batch's gradients measured (no optimizer step yet)."""

    loss: float
    # Mean over groups of the objective's per-row constant (`Objective.baselines`), logged
    # as trainer/log_z: TB's log Z. 0 by construction for the others (up to rounding): RLOO's
    # and GRPO's advantages and online DPO's signed loss shares sum to 0 in every group.
    baseline_mean: float
    policy_logprob: float  # mean sequence log-prob under the policy
    kl: float  # mean of log pi_theta - log pi_ref per sequence
    # Mean of log pi_theta - log pi_ref per completion token, over the rows that carry
    # per-token reference log-probs; None when none does.
    kl_token_mean: float | None
    micro_batches: int
    prepass: bool


@dataclass(frozen=True)
class StepResult:
    gradients: Gradients
    grad_norm: float  # before clipping
    lr: float  # the rate this step trained at
    reward_mean: float
    samples: int
    groups: int
    staleness_mean: float  # versions behind the newest the buffer has seen
    staleness_max: float
    # Groups whose rewards are not all equal: online DPO's pairs; the groups where RLOO's and
    # GRPO's advantages carry a reward signal.
    reward_spread_groups: int


def train_on_batch(
    batch: Batch,
    *,
    engine: TrainEngine,
    objective: Objective,
    reference: ReferenceResets,
    scoring: Scoring,
    micro_batch_size: int,
    beta: float,
    step: int,
    reward_decay: RewardDecay | None = None,
    prior_weight: float = 1.0,
) -> StepResult:
    """Optimizer step `step + 1` on `batch`; every rank calls it with the same batch.
    `prior_weight`: the TB target's weight of log pi_ref this step (`loss.tb_target`)."""
    # Collate: one row per trajectory, each keeping its prompt group (log Z is per group).
    train = collate(batch)
    # Reference log-probs: the searchers' stored ones, or after a reset the frozen copy's.
    train = reference.relabel(train).with_prior_weight(prior_weight)
    if scoring.token_clip is not None:
        # Token-level clipping refuses a batch without per-token behaviour log-probs.
        require_behavior_tokens(train.behavior_tokens, train.completions)
    # The rate this step trains at (the optimizer step moves the schedule on).
    lr = engine.lr()
    # Policy log-probs, loss terms and backward over this rank's micro-batches; when a
    # group is split, its constants (log Z, advantages) come first from the whole batch.
    layout = plan_layout(train, micro_batch_size, engine.rank, engine.world_size)
    gradients = accumulate_gradients(engine, train, layout, objective, beta, scoring)
    reward_mean = float(train.inputs.reward.mean())
    if reward_decay is not None:
        # Before the optimizer step, whose schedule update sets the next step's rate from it.
        reward_decay.observe(reward_mean)
    # Clip, optimizer and schedule step, zeroed gradients (DeepSpeed clips in its own step).
    grad_norm = engine.step()
    # Reference reset (TBA'): every rho steps the reference becomes the policy just stepped.
    if reference.due(step + 1):
        reference.reset(engine.model)
    staleness = (train.latest_version - train.policy_version).clamp(min=0).float()
    return StepResult(
        gradients,
        grad_norm=grad_norm,
        lr=lr,
        reward_mean=reward_mean,
        samples=train.size,
        groups=train.inputs.num_groups,
        staleness_mean=float(staleness.mean()),
        staleness_max=float(staleness.max()),
        reward_spread_groups=reward_spread_groups(train.inputs),
    )


def plan_layout(batch: TrainBatch, micro_batch_size: int, rank: int, world_size: int) -> Layout:
    if world_size == 1:
        plan = plan_micro_batches(batch.inputs.group_index, micro_batch_size)
        rows = torch.arange(batch.size)
        needs_prepass = splits_groups(plan, batch.inputs.group_index)
        return Layout(rows, torch.ones(batch.size), plan, needs_prepass)
    rows, mask = shard_rows(batch.size, rank, world_size)
    positions = torch.arange(rows.numel())
    return Layout(rows, mask, list(torch.split(positions, micro_batch_size)), True)


def policy_logprobs(
    engine: TrainEngine, rows: TrainBatch, scoring: Scoring
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """[n] differentiable policy sequence log-probs of `rows`, and each row's per-token
    log-probs (detached)."""
    with engine.forward_context():
        scored = token_logprobs(
            engine.module,
            rows.prompts,
            rows.completions,
            rows.temperatures(scoring.temperature),
            scoring.pad_token_id,
        )
    tokens = scored.cpu_rows()
    return scored.sums().float().cpu(), tokens


def with_token_weights(
    rows: TrainBatch, policy_tokens: list[torch.Tensor], scoring: Scoring
) -> TrainBatch:
    """`rows` with their token-level importance weights when the clip is per token."""
    if scoring.token_clip is None:
        return rows
    weights = token_importance_weights(policy_tokens, rows.behavior_tokens, scoring.token_clip)
    return rows.with_token_weight(weights)


def accumulate_gradients(
    engine: TrainEngine,
    batch: TrainBatch,
    layout: Layout,
    objective: Objective,
    beta: float,
    scoring: Scoring,
) -> Gradients:
    """Runs forward and backward over this rank's micro-batches (no optimizer step)."""
    n = batch.size
    constants = group_constants(engine, batch, layout, objective, beta, scoring)
    seen = torch.zeros(n)
    sums = torch.zeros(5)  # loss, policy log-prob, kl; token kl and its token count
    for i, positions in enumerate(layout.micro_batches):
        rows, mask = layout.rows[positions], layout.mask[positions]
        part = batch.select(rows)
        logp, tokens = policy_logprobs(engine, part, scoring)
        part = with_token_weights(part, tokens, scoring)
        if constants is None:
            local = objective.baselines(logp, part.inputs, beta)
            seen[rows] = local
        else:
            local = constants[rows]
        terms = objective.terms(logp, part.inputs, beta, local) * mask
        # DeepSpeed averages gradients over ranks: scale back up to the full-batch sum.
        last = i == len(layout.micro_batches) - 1
        engine.backward(terms.sum() * (engine.world_size / n), last=last)
        lp = logp.detach()
        kl = lp - part.inputs.ref_logprob
        sums[:3] += torch.stack([terms.detach().sum() / n, (lp * mask).sum(), (kl * mask).sum()])
        sums[3:] += token_kl_sums(tokens, part.ref_tokens, mask)
    sums = engine.all_reduce_sum(sums)
    per_row = constants if constants is not None else seen
    baseline_mean = group_mean(per_row, batch.inputs.group_index, batch.inputs.num_groups).mean()
    return Gradients(
        loss=float(sums[0]),
        baseline_mean=float(baseline_mean),
        policy_logprob=float(sums[1]) / n,
        kl=float(sums[2]) / n,
        kl_token_mean=float(sums[3] / sums[4]) if sums[4] > 0 else None,
        micro_batches=len(layout.micro_batches),
        prepass=layout.needs_prepass,
    )


def group_constants(
    engine: TrainEngine,
    batch: TrainBatch,
    layout: Layout,
    objective: Objective,
    beta: float,
    scoring: Scoring,
) -> torch.Tensor | None:
    """[n] group constants from a no-grad pass over the whole batch, or None when each
    micro-batch can compute its own."""
    if not layout.needs_prepass:
        return None
    order = torch.cat(layout.micro_batches)
    with torch.no_grad():
        scored = [
            policy_logprobs(engine, batch.select(layout.rows[p]), scoring)
            for p in layout.micro_batches
        ]
    every_row = engine.all_gather(layout.rows[order])
    real = engine.all_gather(layout.mask[order]) > 0

    def gathered(local: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(batch.size)
        full[every_row[real]] = engine.all_gather(local)[real]
        return full

    logp = gathered(torch.cat([sums for sums, _ in scored]))
    if scoring.token_clip is not None:
        tokens = [row for _, rows in scored for row in rows]
        behavior = [batch.behavior_tokens[r] for r in layout.rows[order].tolist()]
        weights = token_importance_weights(tokens, behavior, scoring.token_clip)
        batch = batch.with_token_weight(gathered(weights))
    return objective.baselines(logp, batch.inputs, beta)


def step_metrics(
    result: StepResult, *, beta: float, version: int, times: tuple[float, float, float, float]
) -> dict[str, float]:
    """The values the loop logs for a step; `times`: waiting for data, computing, publishing,
    checkpointing, in seconds."""
    wait_s, compute_s, publish_s, checkpoint_s = times
    step_s = sum(times)
    g = result.gradients
    return {
        "trainer/loss": g.loss,
        "trainer/log_z": g.baseline_mean,
        "trainer/beta": beta,
        "trainer/grad_norm": result.grad_norm,
        "trainer/lr": result.lr,
        "trainer/kl": g.kl,
        **({} if g.kl_token_mean is None else {"trainer/kl_token_mean": g.kl_token_mean}),
        "trainer/policy_logprob": g.policy_logprob,
        "trainer/reward_mean": result.reward_mean,
        "trainer/samples": float(result.samples),
        "trainer/groups": float(result.groups),
        "trainer/reward_spread_groups": float(result.reward_spread_groups),
        "trainer/micro_batches": float(g.micro_batches),
        "trainer/samples_per_s": result.samples / step_s if step_s > 0 else 0.0,
        "trainer/staleness_mean": result.staleness_mean,
        "trainer/staleness_max": result.staleness_max,
        "trainer/version": float(version),
        "time/wait_data_s": wait_s,
        "time/compute_s": compute_s,
        "time/publish_s": publish_s,
        "time/checkpoint_s": checkpoint_s,
    }
