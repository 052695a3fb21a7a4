"""DeepSpeed ZeRO (stage 0-3) data parallelism: the only module that imports deepspeed.

Run under the standard launchers (`deepspeed --num_gpus N -m tba trainer run ...`, or
`torchrun`); on CPU the ranks talk over gloo. Every rank gets the same batch and trains on its
own slice of the rows (`tba.trainer.collate.shard_rows`); DeepSpeed averages gradients over
ranks, so the step scales each rank's loss by the world size to get the full-batch gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import deepspeed
import torch
import torch.distributed as dist

from tba.trainer.config import OptimSettings
from tba.trainer.optim import RewardDecay, build_optimizer, build_scheduler

T = TypeVar("T")
_TAG = "engine"


class DeepSpeedEngine:
    def __init__(
        self,
        model: Any,
        optim: OptimSettings,
        total_steps: int,
        zero_stage: int,
        micro_batch_size: int,
        bf16: bool = False,
        comm_backend: str = "auto",
        reward_decay: RewardDecay | None = None,
    ) -> None:
        backend = comm_backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.zero_stage = zero_stage
        self._model = model
        optimizer = build_optimizer(model.parameters(), optim)
        scheduler = build_scheduler(optimizer, optim, total_steps, reward_decay)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=_config(optim, zero_stage, micro_batch_size, bf16),
        )
        self._scheduler = scheduler

    @property
    def module(self) -> torch.nn.Module:
        module: torch.nn.Module = self.engine
        return module

    @property
    def model(self) -> Any:
        return self._model

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        # DeepSpeed casts the module itself for bf16.
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self._scheduler.get_last_lr()[0])

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def broadcast(self, value: T) -> T:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def publish_state_dict(self) -> Mapping[str, torch.Tensor] | None:
        if self.zero_stage == 3:
            state: Mapping[str, torch.Tensor] = self.engine._zero3_consolidated_16bit_state_dict()
            return state
        return None

    def save(self, folder: Path) -> None:
        self.engine.save_checkpoint(str(folder), tag=_TAG, save_latest=False)

    def load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder), tag=_TAG)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {folder}")


def _config(
    optim: OptimSettings, zero_stage: int, micro_batch_size: int, bf16: bool
) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": optim.max_grad_norm,
        "zero_optimization": {
            "stage": zero_stage,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }
