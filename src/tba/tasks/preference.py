"""`preference`: preference tuning against a learned reward model (TL;DR summarisation in the
paper). Prompts come from a data set (a directory of JSONL files or a hub name); a prompt's
`answer` is the data set's reference completion, which evaluation compares against.

The reward of a completion is the reward model's score of prompt + completion, read at the
last token; a completion the length limit cut (no EOS) gets `unfinished_reward` instead (the
paper's -1). The reward model (and, for evaluation, the gold one) loads on first use, once,
and scores in batches on the device the settings name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.tasks.base import Split, make_prompt
from tba.tasks.config import PreferenceSettings
from tba.tasks.textdata import load_rows, text_field

if TYPE_CHECKING:
    from tba.tasks.scoring import RewardModel

NAME = "preference"


class PreferenceTask:
    def __init__(self, settings: PreferenceSettings) -> None:
        if settings.reward_model is None:
            raise InvalidArgumentError("task preference: set task.preference.reward_model")
        self.settings = settings
        self._reward_path: str = settings.reward_model
        self._gold_path: str = settings.gold_reward_model or settings.reward_model
        self._splits = {
            Split.TRAIN: self._load(settings.train_split),
            Split.TEST: self._load(settings.test_split),
        }
        self._models: dict[str, RewardModel] = {}

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
        """Reward model scores; only finished completions are scored when unfinished ones
        get the fixed `unfinished_reward`."""
        penalty = self.settings.unfinished_reward
        scored = [i for i, done in enumerate(finished) if done or penalty is None]
        rewards = [penalty if penalty is not None else 0.0] * len(prompts)
        if scored:
            texts = [prompts[i].text + completion_texts[i] for i in scored]
            scores = self._model(self._reward_path).score(texts)
            for i, score in zip(scored, scores, strict=True):
                rewards[i] = score
        return rewards

    def gold_scores(
        self, prompts: Sequence[Prompt], completion_texts: Sequence[str]
    ) -> list[float]:
        """Scores of the gold reward model (the judge of evaluation's win rate), unpenalised."""
        texts = [p.text + c for p, c in zip(prompts, completion_texts, strict=True)]
        return self._model(self._gold_path).score(texts)

    def _model(self, path: str) -> RewardModel:
        """The reward model at `path`, loaded on first use (once, even when the gold model
        and the reward model are one)."""
        if path not in self._models:
            from tba.tasks.scoring import RewardModel

            s = self.settings
            self._models[path] = RewardModel(
                path,
                label=s.reward_label,
                batch_size=s.batch_size,
                max_tokens=s.max_tokens,
                append_eos=s.append_eos,
                device=s.device,
                dtype=s.dtype,
            )
        return self._models[path]

    def _load(self, split_name: str) -> list[Prompt]:
        s = self.settings
        rows = load_rows(NAME, s.source, split_name, s.limit, s.hub_config)
        prompts = []
        for index, row in enumerate(rows):
            where = f"{s.source} [{split_name}] row {index}"
            text = text_field(NAME, row, s.prompt_field, where)
            reference = text_field(NAME, row, s.reference_field, where, required=False)
            prompts.append(make_prompt(NAME, text, reference))
        return prompts
