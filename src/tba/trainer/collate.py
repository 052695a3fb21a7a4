"""From a sampled `Batch` of prompt groups to flat training rows, micro-batches and
data-parallel shards.

Rows keep their prompt group (`LossInputs.group_index`), so log Z stays per group whatever
the layout: micro-batches pack whole groups where they fit and split a group only when it is
larger than a micro-batch; the step then computes group constants over the whole batch first
(`trainer.step`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tba.domain import Batch, unpack_logprobs, unpack_tokens
from tba.trainer.loss import LossInputs


@dataclass(frozen=True)
class TrainBatch:
    """One training batch as rows (one per trajectory), grouped by prompt. `behavior_tokens`
    and `ref_tokens` are each row's stored per-token log-probs ([tokens] float32; empty where
    its searcher sent none); `sampling_temperature` ([n] float32) each row's temperature,
    0 where it is the run's."""

    prompts: list[list[int]]
    completions: list[list[int]]
    inputs: LossInputs
    policy_version: torch.Tensor  # [n] int64: weight version that generated each row
    latest_version: int
    behavior_tokens: list[torch.Tensor]
    ref_tokens: list[torch.Tensor]
    sampling_temperature: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.completions)

    def select(self, rows: torch.Tensor) -> TrainBatch:
        picked = rows.tolist()
        return TrainBatch(
            [self.prompts[i] for i in picked],
            [self.completions[i] for i in picked],
            self.inputs.select(rows),
            self.policy_version[rows],
            self.latest_version,
            [self.behavior_tokens[i] for i in picked],
            [self.ref_tokens[i] for i in picked],
            self.sampling_temperature[rows],
        )

    def temperatures(self, run_temperature: float) -> float | torch.Tensor:
        """What to divide logits by: each row's own temperature, the run's where it has none
        (0); the run's as a float when no row has its own, so such a batch is computed
        exactly as before per-round temperatures."""
        own = self.sampling_temperature
        if not bool((own > 0).any()):
            return run_temperature
        return torch.where(own > 0, own, torch.tensor(run_temperature, dtype=own.dtype))

    def with_ref_logprob(
        self, ref_logprob: torch.Tensor, ref_tokens: list[torch.Tensor]
    ) -> TrainBatch:
        inputs = dataclasses.replace(
            self.inputs, ref_logprob=ref_logprob.to(self.inputs.ref_logprob.dtype)
        )
        return dataclasses.replace(self, inputs=inputs, ref_tokens=ref_tokens)

    def with_prior_weight(self, prior_weight: float) -> TrainBatch:
        """The batch with the TB target's weight of log pi_ref set for this step."""
        return dataclasses.replace(
            self, inputs=dataclasses.replace(self.inputs, prior_weight=prior_weight)
        )

    def with_token_weight(self, token_weight: torch.Tensor) -> TrainBatch:
        return dataclasses.replace(
            self, inputs=dataclasses.replace(self.inputs, token_weight=token_weight)
        )


def collate(batch: Batch) -> TrainBatch:
    """Rows of every trajectory of every group, in batch order; empty groups are dropped."""
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    ref, behavior, reward, group, version, temperature = [], [], [], [], [], []
    behavior_tokens: list[torch.Tensor] = []
    ref_tokens: list[torch.Tensor] = []
    groups = [g for g in batch.groups if g.trajectories]
    for index, g in enumerate(groups):
        for t in g.trajectories:
            prompts.append(unpack_tokens(t.prompt_token_ids).tolist())
            completions.append(unpack_tokens(t.completion_token_ids).tolist())
            ref.append(t.ref_logprob)
            behavior.append(t.behavior_logprob)
            reward.append(t.reward)
            group.append(index)
            version.append(t.policy_version)
            temperature.append(t.sampling_temperature)
            behavior_tokens.append(_tensor(t.behavior_token_logprobs))
            ref_tokens.append(_tensor(t.ref_token_logprobs))
    inputs = LossInputs(
        torch.tensor(ref, dtype=torch.float32),
        torch.tensor(behavior, dtype=torch.float32),
        torch.tensor(reward, dtype=torch.float32),
        torch.tensor(group, dtype=torch.long),
        len(groups),
    )
    versions = torch.tensor(version, dtype=torch.long)
    return TrainBatch(
        prompts,
        completions,
        inputs,
        versions,
        batch.latest_version,
        behavior_tokens,
        ref_tokens,
        torch.tensor(temperature, dtype=torch.float32),
    )


def _tensor(packed: bytes) -> torch.Tensor:
    # A copy: frombuffer's array over immutable bytes is read-only, which torch warns about.
    return torch.from_numpy(unpack_logprobs(packed).copy())


def plan_micro_batches(group_index: torch.Tensor, micro_batch_size: int) -> list[torch.Tensor]:
    """Row indices of each micro-batch (at most `micro_batch_size` rows): groups are packed
    whole, first fit in order; a group larger than a micro-batch is split into full ones."""
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be at least 1")
    plan: list[list[int]] = []
    current: list[int] = []
    for rows in _rows_by_group(group_index):
        if len(rows) > micro_batch_size:
            for start in range(0, len(rows), micro_batch_size):
                plan.append(rows[start : start + micro_batch_size])
            continue
        if len(current) + len(rows) > micro_batch_size:
            plan.append(current)
            current = []
        current = current + rows
    if current:
        plan.append(current)
    return [torch.tensor(rows, dtype=torch.long) for rows in plan]


def splits_groups(plan: Sequence[torch.Tensor], group_index: torch.Tensor) -> bool:
    """Whether some group has rows in more than one micro-batch."""
    seen: set[int] = set()
    for rows in plan:
        groups = set(group_index[rows].tolist())
        if groups & seen:
            return True
        seen |= groups
    return False


def shard_rows(num_rows: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous slice of the rows, padded to the same length on every rank
    (every rank must run as many forward/backward passes) with a mask of 0 on the padding."""
    if num_rows < 1:
        raise ValueError("a batch needs at least one row")
    per_rank = -(-num_rows // world_size)
    start = min(rank * per_rank, num_rows)
    rows = list(range(start, min(start + per_rank, num_rows)))
    mask = [1.0] * len(rows) + [0.0] * (per_rank - len(rows))
    rows += [0] * (per_rank - len(rows))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(mask)


def _rows_by_group(group_index: torch.Tensor) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(group_index.tolist()):
        groups.setdefault(g, []).append(row)
    return list(groups.values())
