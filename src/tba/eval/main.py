"""`tba eval`: evaluates a policy on a task's held-out prompts and reports the task's metrics
(pass@1; win rate and perplexity; attack success rate and diversity), and for every task the
diversity of each prompt's completions, as a table and as JSON.

The policy is `[model]`: `tiny`, a model directory, a weight version folder fetched from the
object store (the trainer publishes `from_pretrained` folders), or a hub name.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tba.cli import Flag
from tba.errors import InvalidArgumentError
from tba.eval.config import EvalRunSettings, EvalSettings
from tba.models.config import ModelSettings
from tba.settings import CommandSettings

if TYPE_CHECKING:
    from tba.domain import Prompt
    from tba.eval.perplexity import ReferencePerplexity
    from tba.eval.suites import Complete, DiversityDraw, EvalReport
    from tba.models.generate import GeneratedText
    from tba.tasks.base import Task

HELP = "Evaluate a policy on a task's held-out prompts (pass@1, win rate, attack success)."
log = logging.getLogger(__name__)


# The policy's completer at a sampling temperature.
Sampler = Callable[[float], "Complete"]

SETTINGS = EvalRunSettings
# Shown in `--help` as the example of `--set`.
SET_EXAMPLE = "eval.limit=100"
FLAGS = (
    Flag(
        "--model",
        "model.source",
        "`tiny`, a model or weight version directory, or hub name",
        metavar="MODEL",
    ),
    Flag("--task", "task.name", "the task evaluated", metavar="TASK"),
    Flag("--limit", "eval.limit", "evaluate the first N prompts only", metavar="N"),
    Flag("--output", "eval.output", "write the report as JSON to this path", metavar="PATH"),
    Flag("--split", "eval.split", "`test` (default) or `train`", metavar="SPLIT"),
)


def run(settings: CommandSettings) -> None:
    assert isinstance(settings, EvalRunSettings)
    import torch

    from tba.eval.report import print_report, write_report

    torch.manual_seed(settings.eval.seed)
    try:
        report = evaluate_policy(settings)
    except InvalidArgumentError as exc:
        sys.exit(f"error: {exc}")
    print_report(report, settings.model.source, settings.eval.show_samples)
    if settings.eval.output:
        extra = {"model": settings.model.source, "eval": settings.eval.model_dump(mode="json")}
        write_report(report, Path(settings.eval.output), extra)
        print(f"report written to {settings.eval.output}", flush=True)


def evaluate_policy(settings: EvalRunSettings) -> EvalReport:
    """Loads the task and the policy, completes the prompts, and runs the task's suite."""
    from tba.tasks.base import Split
    from tba.tasks.registry import build_task

    e = settings.eval
    task = build_task(settings.task)
    prompts = task.prompts(Split(e.split))[: e.limit]
    if not prompts:
        raise InvalidArgumentError(f"task {task.name} has no {e.split} prompts")
    sample = policy_sampler(settings)
    log.info("evaluating %s on %d %s prompts", settings.model.source, len(prompts), e.split)
    started = time.monotonic()
    report = run_suite(task, prompts, sample, settings)
    # From the loaded policy on: the task's models load on first use, inside.
    report.metrics["eval/seconds"] = time.monotonic() - started
    return report


def run_suite(
    task: Task, prompts: list[Prompt], sample: Sampler, settings: EvalRunSettings
) -> EvalReport:
    from tba.eval import suites
    from tba.tasks.preference import PreferenceTask
    from tba.tasks.redteam import RedteamTask

    e = settings.eval
    n = e.samples_per_prompt
    complete = sample(e.temperature)
    draw = diversity_draw(e, sample)
    if isinstance(task, PreferenceTask):
        perplexity = reference_perplexity(e.reference_model, e) if e.reference_model else None
        return suites.evaluate_preference(task, prompts, complete, n, e.split, perplexity, draw)
    if isinstance(task, RedteamTask):
        from tba.models.device import pick_device
        from tba.tasks.embedding import load_embedder

        device = pick_device(task.settings.device).type
        embedder = load_embedder(task.settings.embedding_model, device)
        return suites.evaluate_redteam(
            task, prompts, complete, n, e.split, embedder, e.success_threshold, draw
        )
    return suites.evaluate_math(task, prompts, complete, n, e.split, draw)


def diversity_draw(e: EvalSettings, sample: Sampler) -> DiversityDraw | None:
    """Completions to draw for diversity alone; None when the scored completions are sampled
    groups (measured as they are) or `diversity_samples` turns the draw off."""
    from tba.eval.suites import DiversityDraw

    if (e.samples_per_prompt >= 2 and e.temperature > 0) or e.diversity_samples < 2:
        return None
    return DiversityDraw(sample(e.diversity_temperature), e.diversity_samples, e.diversity_prompts)


def policy_sampler(settings: EvalRunSettings) -> Sampler:
    """Loads the policy once; the completer it gives for a temperature completes prompt
    texts with the policy at that temperature and `[eval]` length."""
    from tba.models.generate import generate_texts
    from tba.models.loading import load_model

    e = settings.eval
    tokenizer, model = load_model(settings.model, e.seed)
    _place(model, e.device, e.dtype)
    model.eval()

    def sample(temperature: float) -> Complete:
        def complete(texts: Sequence[str]) -> list[GeneratedText]:
            groups = generate_texts(
                model,
                tokenizer,
                texts,
                max_new_tokens=e.max_new_tokens,
                temperature=temperature,
                batch_size=e.batch_size,
                seed=e.seed,
            )
            return [group[0] for group in groups]

        return complete

    return sample


def reference_perplexity(source: str, e: EvalSettings) -> ReferencePerplexity:
    from tba.eval.perplexity import ReferencePerplexity
    from tba.models.loading import load_model

    tokenizer, model = load_model(ModelSettings(source=source), e.seed)
    _place(model, e.device, e.dtype)
    return ReferencePerplexity(tokenizer, model, e.reference_batch_size)


def _place(model: Any, device: str, dtype: str) -> None:
    from tba.models.device import pick_device, pick_dtype

    target = pick_device(device)
    model.to(device=target, dtype=pick_dtype(dtype, target))
