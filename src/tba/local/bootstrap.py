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
from typing import Any

import torch

from tba.domain import Prompt
from tba.local.config import BootstrapSettings
from tba.local.evaluator import GreedyAccuracy
from tba.models.logprobs import sequence_logprobs
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.tasks.base import Split, Task

log = logging.getLogger(__name__)
INFO_FILE = "bootstrap.json"


def cache_dir(run_dir: Path, settings: BootstrapSettings, prompts: Sequence[Prompt]) -> Path:
    """One folder per (settings, train prompts): a changed task never reuses a stale base."""
    digest = hashlib.sha256(settings.model_dump_json().encode())
    for prompt in prompts:
        digest.update(prompt.id.encode())
    return run_dir / f"base-{digest.hexdigest()[:12]}"


def bootstrap_base_model(run_dir: Path, settings: BootstrapSettings, task: Task) -> Path:
    """Returns a `from_pretrained` directory; trains it only when not cached."""
    train_prompts = task.prompts(Split.TRAIN)
    target = cache_dir(run_dir, settings, train_prompts)
    if (target / INFO_FILE).exists():
        log.info("base model cached in %s", target)
        return target
    if settings.validation_prompts >= len(train_prompts):
        raise ValueError("bootstrap.validation_prompts must leave train prompts to learn from")
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
    held_out = train_prompts[: settings.validation_prompts]
    answer_tokens = max(
        len(tokenizer(p.answer, add_special_tokens=False).input_ids) for p in held_out
    )
    validation = GreedyAccuracy(task, held_out, tokenizer, max_new_tokens=answer_tokens + 1)
    info = _supervised_warmup(
        model, tokenizer, train_prompts[settings.validation_prompts :], validation, settings
    )
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    info["seconds"] = time.monotonic() - started_s
    (target / INFO_FILE).write_text(json.dumps(info, indent=2))
    log.info("base model trained in %.0f s (%s): %s", info["seconds"], info, target)
    return target


def _supervised_warmup(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    validation: GreedyAccuracy,
    s: BootstrapSettings,
) -> dict[str, float]:
    """Maximum likelihood of `answer` + EOS after each prompt, until the validation accuracy
    reaches `target_accuracy` (checked every `check_every_steps`) or `steps` run out."""
    rng = random.Random(s.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr)
    eos = tokenizer.eos_token_id
    loss = torch.tensor(0.0)
    accuracy, step = 0.0, 0
    model.train()
    while step < s.steps:
        batch = [rng.choice(prompts) for _ in range(s.batch_size)]
        prompt_ids = [tokenizer(p.text).input_ids for p in batch]
        answers = [[*tokenizer(p.answer, add_special_tokens=False).input_ids, eos] for p in batch]
        logprobs = sequence_logprobs(model, prompt_ids, answers, 1.0, tokenizer.pad_token_id)
        loss = -logprobs.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if s.target_accuracy > 0 and step % s.check_every_steps == 0:
            accuracy = validation(model)
            model.train()
            if accuracy >= s.target_accuracy:
                break
    model.eval()
    return {"steps": step, "final_loss": float(loss.detach()), "validation_accuracy": accuracy}
