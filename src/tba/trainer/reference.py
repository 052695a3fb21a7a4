"""Reference resets (TBA'): every rho steps the reference policy becomes the current policy.

Searchers compute log pi_ref once per trajectory against the reference they were started with
and store it (`Trajectory.ref_logprob`); they know nothing of resets. So from the first reset
on, the trainer keeps a frozen copy of the policy taken at the last reset and recomputes the
reference log-prob of every row it trains on with that copy (data older than the reset
included: its stored value is for the old reference). Before the first reset the stored
values are used and no reference model runs. The cost after the first reset is one no-grad
forward of the batch per step, and the copy's memory; the copy is saved in checkpoints. The
same pass gives the per-token reference log-probs (`trainer/kl_token_mean`), so those of the
stored trajectories, for the old reference, are replaced too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from tba.models.logprobs import token_logprobs
from tba.trainer.collate import TrainBatch


class ReferenceResets:
    def __init__(
        self,
        every_steps: int,
        temperature: float,
        pad_token_id: int,
        micro_batch_size: int,
        forward_context: Callable[
            [], contextlib.AbstractContextManager[Any]
        ] = contextlib.nullcontext,
    ) -> None:
        self.every_steps = every_steps
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size
        self.forward_context = forward_context
        self.module: torch.nn.Module | None = None

    def due(self, step: int) -> bool:
        """Whether the reference resets after optimizer step `step` (1-based)."""
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

    def reset(self, policy: Any) -> None:
        """Takes a frozen copy of `policy` (a transformers model) as the new reference."""
        self.restore(policy, policy.state_dict())

    def restore(self, policy: Any, state: dict[str, torch.Tensor]) -> None:
        """Makes the reference a model like `policy` holding `state` (from a checkpoint)."""
        if self.module is None:
            self.module = type(policy)(policy.config).to(next(policy.parameters()).device)
        self.module.load_state_dict(state)
        self.module.eval()
        self.module.requires_grad_(False)

    def relabel(self, batch: TrainBatch) -> TrainBatch:
        """`batch` with reference log-probs, sums and per token, from the frozen copy
        (unchanged before a reset)."""
        if self.module is None:
            return batch
        sums, tokens = [], []
        with torch.no_grad(), self.forward_context():
            for start in range(0, batch.size, self.micro_batch_size):
                # Each row at its own sampling temperature, as the searcher scored it.
                part = batch.select(
                    torch.arange(start, min(start + self.micro_batch_size, batch.size))
                )
                scored = token_logprobs(
                    self.module,
                    part.prompts,
                    part.completions,
                    part.temperatures(self.temperature),
                    self.pad_token_id,
                )
                sums.append(scored.sums().float().cpu())
                tokens += scored.cpu_rows()
        return batch.with_ref_logprob(torch.cat(sums), tokens)

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        if self.module is None:
            return None
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}
