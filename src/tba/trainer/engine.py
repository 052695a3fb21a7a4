"""How the loop runs a model: forward context, backward, optimizer step, collectives, state.

`TrainEngine` is what the loop and the step see; `LocalEngine` is plain PyTorch in one
process, `tba.trainer.deepspeed_engine.DeepSpeedEngine` is ZeRO data parallelism.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from tba.trainer.config import OptimSettings
from tba.trainer.optim import RewardDecay, build_optimizer, build_scheduler

T = TypeVar("T")
ENGINE_FILE = "engine.pt"


class TrainEngine(Protocol):
    rank: int
    world_size: int

    @property
    def module(self) -> torch.nn.Module:
        """What to call forward on (the wrapped module under DeepSpeed)."""
        ...

    @property
    def model(self) -> Any:
        """The transformers model itself (config, save_pretrained)."""
        ...

    def forward_context(self) -> contextlib.AbstractContextManager[Any]: ...

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulates gradients; `last` marks the final micro-batch of a step."""
        ...

    def step(self) -> float:
        """Clips, steps optimizer and schedule, zeroes gradients; the pre-clip grad norm."""
        ...

    def lr(self) -> float: ...

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Equal-shaped tensors of every rank, concatenated along dim 0 in rank order."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def broadcast(self, value: T) -> T:
        """Rank 0's `value` on every rank."""
        ...

    def barrier(self) -> None: ...

    def publish_state_dict(self) -> Mapping[str, torch.Tensor] | None:
        """Full weights for publishing (a collective under ZeRO-3); None: the model's own."""
        ...

    def save(self, folder: Path) -> None:
        """Model, optimizer and schedule state (every rank calls it)."""
        ...

    def load(self, folder: Path) -> None: ...


class LocalEngine:
    """One process, plain PyTorch: AdamW, LambdaLR schedule, optional bf16 autocast."""

    rank = 0
    world_size = 1

    def __init__(
        self,
        model: Any,
        optim: OptimSettings,
        total_steps: int,
        bf16: bool = False,
        device: torch.device | None = None,
        reward_decay: RewardDecay | None = None,
    ) -> None:
        self._model = model.to(device or torch.device("cpu"))
        self.optimizer = build_optimizer(self._model.parameters(), optim)
        self.scheduler = build_scheduler(self.optimizer, optim, total_steps, reward_decay)
        self.max_grad_norm = optim.max_grad_norm
        self.bf16 = bf16

    @property
    def module(self) -> torch.nn.Module:
        module: torch.nn.Module = self._model
        return module

    @property
    def model(self) -> Any:
        return self._model

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        device_type = next(self._model.parameters()).device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.bf16):
            yield

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for p in self._model.parameters() if p.requires_grad]
        limit = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast(self, value: T) -> T:
        return value

    def barrier(self) -> None:
        return None

    def publish_state_dict(self) -> Mapping[str, torch.Tensor] | None:
        return None

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self._model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        torch.save(state, folder / ENGINE_FILE)

    def load(self, folder: Path) -> None:
        state = torch.load(folder / ENGINE_FILE, map_location="cpu", weights_only=True)
        self._model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
