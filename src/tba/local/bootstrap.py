"""The demo's base model: a tiny GPT-2 and char-level tokenizer, briefly pre-trained with
supervised learning on the task's train split, so RL starts from modest accuracy with room to
improve. Seeded and cached in the run directory by its settings."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tba.domain import Prompt
from tba.local.config import BootstrapSettings
from tba.models.logprobs import sequence_logprobs
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer

log = logging.getLogger(__name__)
INFO_FILE = "bootstrap.json"


def cache_dir(run_dir: Path, settings: BootstrapSettings, prompts: Sequence[Prompt]) -> Path:
    """One folder per (settings, train prompts): a changed task never reuses a stale base."""
    digest = hashlib.sha256(settings.model_dump_json().encode())
    for prompt in prompts:
        digest.update(prompt.id.encode())
    return run_dir / f"base-{digest.hexdigest()[:12]}"


def bootstrap_base_model(
    run_dir: Path, settings: BootstrapSettings, train_prompts: Sequence[Prompt]
) -> Path:
    """Returns a `from_pretrained` directory; trains it only when not cached."""
    target = cache_dir(run_dir, settings, train_prompts)
    if (target / INFO_FILE).exists():
        log.info("base model cached in %s", target)
        return target
    torch.manual_seed(settings.seed)
    tokenizer = build_tiny_tokenizer(settings.chars)
    model = build_tiny_model(
        tokenizer,
        n_layer=settings.n_layer,
        n_embd=settings.n_embd,
        n_head=settings.n_head,
        n_positions=settings.n_positions,
        seed=settings.seed,
    )
    started_s = time.monotonic()
    final_loss = _supervised_warmup(model, tokenizer, train_prompts, settings)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    info = {
        "steps": settings.steps,
        "final_loss": final_loss,
        "seconds": time.monotonic() - started_s,
    }
    (target / INFO_FILE).write_text(json.dumps(info, indent=2))
    log.info("base model trained in %.0f s (loss %.3f): %s", info["seconds"], final_loss, target)
    return target


def _supervised_warmup(
    model: torch.nn.Module, tokenizer: object, prompts: Sequence[Prompt], s: BootstrapSettings
) -> float:
    """Maximum likelihood of `answer` + EOS after each prompt, for a fixed number of steps
    (the base is chosen by step count, never by time)."""
    rng = random.Random(s.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr)
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    loss = torch.tensor(0.0)
    model.train()
    for _ in range(s.steps):
        batch = [rng.choice(prompts) for _ in range(s.batch_size)]
        prompt_ids = [tokenizer(p.text).input_ids for p in batch]  # type: ignore[operator]
        answers = [
            [*tokenizer(p.answer, add_special_tokens=False).input_ids, eos]  # type: ignore[operator]
            for p in batch
        ]
        logprobs = sequence_logprobs(model, prompt_ids, answers, 1.0, tokenizer.pad_token_id)  # type: ignore[attr-defined]
        loss = -logprobs.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())
