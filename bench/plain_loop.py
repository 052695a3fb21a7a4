"""The simplest thing a user could write instead of TBA: one process, on-policy RLOO over the
project's own generate and log-prob functions, no services, no buffer, no reference model.

Each step samples K completions of B train prompts at temperature 1, scores them with the
task, and takes one Adam step on -mean(A_j log pi(y_j)) with leave-one-out advantages of the
plain reward (the project's `Rloo` objective at beta 0). Every `eval_every_s` of training it
scores the policy greedily on the held-out prompts as `tba local` does; evaluation time is
left out of the clock, so the loop is timed as if an idle core evaluated it.

`python -m bench.plain_loop --model DIR --out eval.jsonl` runs it alone.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tba.local.evaluator import GreedyAccuracy
from tba.models.generate import generate_texts
from tba.models.loading import quiet_progress_bars
from tba.models.logprobs import sequence_logprobs
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split
from tba.trainer.loss import LossInputs, Rloo


@dataclass(frozen=True)
class LoopSettings:
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    lr: float = 1e-4
    max_grad_norm: float = 1.0
    max_new_tokens: int = 5
    threads: int = 2
    eval_prompts: int = 500
    eval_every_s: float = 5.0
    seed: int = 0


def _step(model, tokenizer, optimizer, task, prompts, s: LoopSettings) -> float:
    """One on-policy RLOO step; the batch's mean reward."""
    model.eval()
    groups = generate_texts(
        model, tokenizer, [p.text for p in prompts], s.max_new_tokens, 1.0, n=s.samples_per_prompt
    )
    prompt_ids, completions, rewards, group_index = [], [], [], []
    for g, (prompt, samples) in enumerate(zip(prompts, groups, strict=True)):
        ids = tokenizer(prompt.text).input_ids
        for sample in samples:
            prompt_ids.append(ids)
            completions.append(sample.token_ids)
            rewards.append(task.reward(prompt, sample.text))
            group_index.append(g)
    reward = torch.tensor(rewards)
    zeros = torch.zeros_like(reward)
    inputs = LossInputs(zeros, zeros, reward, torch.tensor(group_index), len(prompts))
    model.train()
    logprob = sequence_logprobs(model, prompt_ids, completions, 1.0, tokenizer.pad_token_id)
    objective = Rloo()
    loss = objective.terms(logprob, inputs, 0.0, objective.baselines(logprob, inputs, 0.0)).mean()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
    optimizer.step()
    return float(reward.mean())


def run_plain_loop(
    model_dir: Path,
    out: Path,
    s: LoopSettings,
    *,
    stop_at: float = 0.90,
    limit_s: float = 480.0,
    max_steps: int | None = None,
) -> list[dict[str, float]]:
    """Trains until held-out accuracy reaches `stop_at`, `limit_s` of training time or
    `max_steps`; the evaluation points (also written to `out` as JSONL, as `tba local` writes
    eval.jsonl)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    task = ArithmeticTask()
    train = task.prompts(Split.TRAIN)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    held_out = task.prompts(Split.TEST)[: s.eval_prompts]
    accuracy = GreedyAccuracy(task, held_out, tokenizer, s.max_new_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    points = [{"wall_s": 0.0, "step": 0, "accuracy": accuracy(model)}]
    out.write_text(json.dumps(points[0]) + "\n")
    train_s, step, last_eval_s = 0.0, 0, 0.0
    while points[-1]["accuracy"] < stop_at and train_s < limit_s and step != max_steps:
        started = time.monotonic()
        _step(model, tokenizer, optimizer, task, rng.sample(train, s.prompts_per_step), s)
        train_s += time.monotonic() - started
        step += 1
        if train_s - last_eval_s >= s.eval_every_s:
            last_eval_s = train_s
            points.append({"wall_s": train_s, "step": step, "accuracy": accuracy(model)})
            with out.open("a") as sink:
                sink.write(json.dumps(points[-1]) + "\n")
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="base model directory")
    parser.add_argument("--out", type=Path, required=True, help="eval points (JSONL)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit-s", type=float, default=480.0, help="most seconds of training")
    parser.add_argument("--steps", type=int, help="most steps")
    args = parser.parse_args()
    quiet_progress_bars()  # the bench's log, not a bar per base
    settings = LoopSettings(seed=args.seed)
    points = run_plain_loop(
        args.model, args.out, settings, limit_s=args.limit_s, max_steps=args.steps
    )
    print(json.dumps(points[-1]))


if __name__ == "__main__":
    main()
