"""What every benchmark returns: rows of measured values beside their baseline."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tba.models.tiny import build_tiny_tokenizer


@dataclass(frozen=True)
class Row:
    """One measured figure. `ratio` is measured relative to the baseline of the same run,
    oriented as the target states it (e.g. "loop / bare tokens/s >= 0.9")."""

    benchmark: str
    case: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None


@dataclass(frozen=True)
class ProcStat:
    parent_pid: int
    cpu_s: float  # user + system, all threads


def proc_stat(pid: int) -> ProcStat:
    """A process's parent and CPU seconds so far, from /proc (Linux); OSError once it is gone."""
    # The command name, in parentheses, may hold spaces: fields are counted after it.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ProcStat(int(fields[1]), ticks / os.sysconf("SC_CLK_TCK"))


def cpu_waited_s() -> float | None:
    """Seconds since boot in which at least one runnable task waited for a core (Linux's
    pressure stall information, the `some` line of /proc/pressure/cpu); None where the kernel
    does not report it."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return int(some.rsplit("total=", 1)[1]) / 1e6


def gpt2_100m(quick: bool, *, n_positions: int) -> tuple[Any, Any]:
    """A seeded GPT-2 of ~100M parameters (~2M with `quick`) on the tiny tokenizer, and that
    tokenizer: the model the publish and swap benchmarks move around."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_tiny_tokenizer()
    layers, width = (2, 256) if quick else (14, 768)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=width,
        n_layer=layers,
        n_head=max(width // 64, 1),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config), tokenizer


def engine_kinds() -> list[str]:
    """The searcher engines this machine can run: transformers, and vLLM where installed."""
    if importlib.util.find_spec("vllm") is not None:
        return ["transformers", "vllm"]
    print("vllm is not installed: the vllm engine is skipped", flush=True)
    return ["transformers"]
