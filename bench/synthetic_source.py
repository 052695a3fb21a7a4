"""Batches for a trainer without a buffer: a fixed pool of prompt groups of random-token
trajectories, drawn as the buffer draws them. For benchmarks that time the trainer's work on a
batch, whatever the tokens say."""

from __future__ import annotations

from typing import Any

import numpy as np

from tba.domain import Batch, Prompt, PromptGroup, SampleSource, SampleSpec, Trajectory, pack_tokens


class SyntheticSource:
    """Groups of random-token trajectories, drawn by the spec's seed as the buffer draws by
    reward priority at tau = inf (uniformly)."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_tokens: int,
        completion_tokens: int,
        per_group: int,
        groups: int = 8,
    ) -> None:
        rng = np.random.default_rng(0)
        special = set(tokenizer.all_special_ids)
        tokens = np.array([t for t in range(len(tokenizer)) if t not in special])
        # A random-init model is near uniform: log-probs near those of uniform tokens.
        logprob = -completion_tokens * float(np.log(len(tokenizer)))
        self.pool = [
            [
                Trajectory(
                    prompt_id=f"p{g}",
                    prompt_token_ids=pack_tokens(rng.choice(tokens, prompt_tokens).tolist()),
                    completion_token_ids=pack_tokens(
                        rng.choice(tokens, completion_tokens).tolist()
                    ),
                    completion_text="",
                    reward=float(rng.random()),
                    ref_logprob=logprob,
                    behavior_logprob=logprob,
                    policy_version=0,
                )
                for _ in range(per_group)
            ]
            for g in range(groups)
        ]

    def sample(self, spec: SampleSpec) -> Batch:
        rng = np.random.default_rng(spec.seed)
        chosen = rng.choice(len(self.pool), size=spec.num_prompts, replace=False)
        groups = []
        for g in chosen:
            picks = rng.choice(len(self.pool[g]), size=spec.samples_per_prompt, replace=False)
            trajectories = [self.pool[g][i] for i in picks]
            groups.append(PromptGroup(Prompt(f"p{g}", ""), trajectories, SampleSource.REWARD))
        return Batch(groups, latest_version=0)
