"""Tiny models that `tba local` builds from configs for the CPU-sized runs of non-demo tasks:
`[model] source = "tiny"` becomes a saved tiny policy (one directory, so trainer, searchers and
the evaluator share its weights), and a task model set to `tiny` (reward model, victim,
classifier) a tiny randomly initialised one of the right kind on the same char tokenizer.
They exercise every code path of a task on one machine; their rewards mean nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tba.inputs import TINY
from tba.models.config import ModelSettings
from tba.tasks.config import TaskSettings

TASK_MODEL_WIDTH = 32
TASK_MODEL_POSITIONS = 1024


def tiny_policy(model: ModelSettings, folder: Path, seed: int) -> Path:
    """The tiny policy `model` describes, built from `seed` and saved in `folder`."""
    from tba.models.loading import materialize

    shutil.rmtree(folder, ignore_errors=True)
    return materialize(model, seed, folder)


def with_tiny_task_models(task: TaskSettings, folder: Path) -> TaskSettings:
    """`task` with each of its models set to `tiny` replaced by a tiny one saved in `folder`."""
    if task.name == "preference":
        p = task.preference
        labels = [f"LABEL_{i}" for i in range(p.reward_label + 1)]
        for field in ("reward_model", "gold_reward_model"):
            if getattr(p, field) == TINY:
                setattr(p, field, str(_classifier(folder / field, labels)))
    if task.name == "redteam":
        r = task.redteam
        if r.victim_model == TINY:
            r.victim_model = str(_causal_lm(folder / "victim_model"))
        if r.classifier_model == TINY:
            label = r.toxic_label
            labels = (
                [f"LABEL_{i}" for i in range(max(2, int(label) + 1))]
                if label.isdigit()
                else [f"not_{label}", label]
            )
            r.classifier_model = str(_classifier(folder / "classifier_model", labels))
    return task


def _causal_lm(directory: Path) -> Path:
    from tba.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, n_layer=2, n_embd=TASK_MODEL_WIDTH, n_head=2, n_positions=TASK_MODEL_POSITIONS
    )
    return _save(directory, tokenizer, model)


def _classifier(directory: Path, labels: list[str]) -> Path:
    """A tiny GPT-2 sequence classifier with `labels` (one label: a reward model)."""
    from tba.models.tiny import build_tiny_classifier, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_classifier(tokenizer, labels, TASK_MODEL_WIDTH, TASK_MODEL_POSITIONS)
    return _save(directory, tokenizer, model)


def _save(directory: Path, tokenizer: Any, model: Any) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
