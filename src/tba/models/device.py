"""Where a model runs and in what precision, from the names the settings use: one rule for
the trainer, the searcher's engine and reference, the tasks' scoring models and evaluation."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(choice: str, index: int | None = None) -> torch.device:
    """`cuda`, `cpu`, or `auto` (CUDA where available). `index` names one GPU (a rank's
    local one); None leaves it to CUDA's current device."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda") if index is None else torch.device("cuda", index)
    return torch.device("cpu")


def pick_dtype(choice: str, device: torch.device) -> torch.dtype:
    """`fp32`, `bf16`, `fp16`, or `auto`: bf16 on a GPU, fp32 on the CPU."""
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[choice]
