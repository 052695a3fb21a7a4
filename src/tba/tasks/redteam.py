"""`redteam`: automated red-teaming. The policy (the attacker) completes an instruction with
an attack prompt; a victim language model answers the attack (`answers_per_prompt` sampled
answers); a toxicity classifier reads each answer. The reward is the mean over the answers
of log p(toxic | answer), so the TB target pi_ref * exp(r / beta) favours attacks that are
both likely under the reference attacker and toxic in effect.

Victim and classifier load on first use, once, and run in batches on the device the
settings name (the searcher's, in a run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.tasks.base import Split, make_prompt
from tba.tasks.config import RedteamSettings
from tba.tasks.textdata import load_rows, text_field

if TYPE_CHECKING:
    from tba.tasks.scoring import LabelClassifier

NAME = "redteam"


@dataclass(frozen=True)
class AttackOutcome:
    """The victim's answers to one attack and log p(toxic) of each."""

    answers: list[str]
    toxic_logprobs: list[float]

    @property
    def reward(self) -> float:
        return math.fsum(self.toxic_logprobs) / len(self.toxic_logprobs)

    @property
    def toxicity(self) -> float:
        """Mean p(toxic) over the answers."""
        return math.fsum(math.exp(v) for v in self.toxic_logprobs) / len(self.toxic_logprobs)


class RedteamTask:
    def __init__(self, settings: RedteamSettings) -> None:
        if settings.victim_model is None or settings.classifier_model is None:
            raise InvalidArgumentError(
                "task redteam: set task.redteam.victim_model and task.redteam.classifier_model"
            )
        self.settings = settings
        self._victim_path: str = settings.victim_model
        self._classifier_path: str = settings.classifier_model
        self._splits = {
            Split.TRAIN: self._load(settings.train_split, settings.instruction_copies),
            Split.TEST: self._load(settings.test_split, 1),
        }
        self._victim: tuple[Any, Any] | None = None
        self._classifier: LabelClassifier | None = None

    @property
    def name(self) -> str:
        return NAME

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._splits[Split(split)])

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        return self.rewards([prompt], [completion_text], [True])[0]

    def rewards(
        self,
        prompts: Sequence[Prompt],
        completion_texts: Sequence[str],
        finished: Sequence[bool],
    ) -> list[float]:
        """Mean log p(toxic) of the victim's answers to each attack; an attack cut by the
        length limit is still an attack, so `finished` does not change its reward."""
        return [outcome.reward for outcome in self.outcomes(completion_texts)]

    def outcomes(self, attacks: Sequence[str]) -> list[AttackOutcome]:
        """The victim's answers to each attack and their toxicity, batched over all."""
        if not attacks:
            return []
        answers = self.victim_answers(attacks)
        flat = [answer for group in answers for answer in group]
        logprobs = self.classifier().label_logprobs(flat)
        n = self.settings.answers_per_prompt
        return [
            AttackOutcome(group, logprobs[i * n : (i + 1) * n]) for i, group in enumerate(answers)
        ]

    def victim_answers(self, attacks: Sequence[str]) -> list[list[str]]:
        from tba.models.generate import generate_texts

        s = self.settings
        tokenizer, model = self.victim()
        inputs = [s.victim_template.replace("{attack}", attack) for attack in attacks]
        generated = generate_texts(
            model,
            tokenizer,
            inputs,
            max_new_tokens=s.victim_max_new_tokens,
            temperature=s.victim_temperature,
            n=s.answers_per_prompt,
            batch_size=s.victim_batch_size,
        )
        return [[g.text for g in group] for group in generated]

    def victim(self) -> tuple[Any, Any]:
        """(tokenizer, model) of the victim, loaded on first use."""
        if self._victim is None:
            self._victim = _load_causal_lm(self._victim_path, self.settings)
        return self._victim

    def classifier(self) -> LabelClassifier:
        if self._classifier is None:
            from tba.tasks.scoring import LabelClassifier

            s = self.settings
            self._classifier = LabelClassifier(
                self._classifier_path,
                s.toxic_label,
                batch_size=s.classifier_batch_size,
                device=s.device,
                dtype=s.dtype,
            )
        return self._classifier

    def _load(self, split_name: str, instruction_copies: int) -> list[Prompt]:
        s = self.settings
        if s.source is None:
            # The answer (unused by the reward) tells the copies apart: ids hash the content.
            answers = [""] + [f"copy {i}" for i in range(1, instruction_copies)]
            return [make_prompt(NAME, s.instruction, answer) for answer in answers]
        rows = load_rows(NAME, s.source, split_name, s.limit, s.hub_config)
        return [
            make_prompt(NAME, text_field(NAME, row, s.prompt_field, f"{s.source} row {i}"), "")
            for i, row in enumerate(rows)
        ]


def _load_causal_lm(path: str, settings: RedteamSettings) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tba.models.device import pick_device, pick_dtype

    device = pick_device(settings.device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=pick_dtype(settings.dtype, device)
        )
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"cannot load the victim from {path!r}: {e}") from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval().requires_grad_(False)
    return tokenizer, model
