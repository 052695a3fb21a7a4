"""Makes a committed base model of the arithmetic demo: runs the demo's bootstrap (`[bootstrap]`
defaults, one torch thread as in `tba local`) with a seed, copies the result to OUT with a
`SHA256SUMS` file, and prints its held-out greedy accuracy and sampled coverage.

The bootstrap is chaotic (float rounding differs between CPUs), so a base made here is not
reproducible bit for bit elsewhere: that is why the demo's base is committed. Used to make
src/tba/local/bases/demo (seed 0) and bench/bases/* (the benchmark's other bases):

    python scripts/make_demo_base.py --seed 0 --out src/tba/local/bases/demo
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

from tba.local.bases import write_checksums
from tba.local.bootstrap import bootstrap_base_model
from tba.local.config import BootstrapSettings
from tba.local.evaluator import GreedyAccuracy
from tba.models.generate import generate_texts
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split

# What the bootstrap writes that a base needs (bootstrap.json records how it was made).
KEEP = ("*.json", "*.safetensors", "*.txt")


def describe(base: Path, prompts: int = 500, samples: int = 8) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts, and the share of them with at least one right
    answer among `samples` completions at temperature 1 (what RL can learn from)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task = ArithmeticTask()
    held_out = task.prompts(Split.TEST)[:prompts]
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    accuracy = GreedyAccuracy(task, held_out, tokenizer, max_new_tokens=5)(model)
    groups = generate_texts(
        model, tokenizer, [p.text for p in held_out], 5, 1.0, n=samples, batch_size=512, seed=0
    )
    rewards = [[task.reward(p, s.text) for s in g] for p, g in zip(held_out, groups, strict=True)]
    return {
        "held_out_accuracy": accuracy,
        f"coverage_at_{samples}": sum(max(r) for r in rewards) / len(rewards),
        "sample_reward_mean": sum(map(sum, rewards)) / (len(rewards) * samples),
    }


def record_origin(base: Path, seed: int, threads: int) -> None:
    """Adds how the base was made to the bootstrap's own record."""
    info_path = base / "bootstrap.json"
    info = json.loads(info_path.read_text())
    info.update(
        seed=seed, threads=threads, torch=torch.__version__, made_by="scripts/make_demo_base.py"
    )
    info_path.write_text(json.dumps(info, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, required=True, help="bootstrap seed")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the base to")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tba local: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        made = bootstrap_base_model(Path(tmp), BootstrapSettings(seed=args.seed), ArithmeticTask())
        args.out.mkdir(parents=True, exist_ok=True)
        for pattern in KEEP:
            for path in made.glob(pattern):
                shutil.copy2(path, args.out / path.name)
    record_origin(args.out, args.seed, args.threads)
    write_checksums(args.out)
    print(json.dumps({"seed": args.seed, "out": str(args.out), **describe(args.out)}))


if __name__ == "__main__":
    main()
