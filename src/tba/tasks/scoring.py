"""Sequence-classification models that score text for tasks: a reward model read at the last
token of each sequence, and a classifier's log-probability of one label. Each is loaded once
(by the task that owns it) and runs batched on the device its settings name."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from tba.errors import InvalidArgumentError
from tba.models.device import pick_device, pick_dtype
from tba.models.generate import padded


def load_sequence_classifier(path: str, device: torch.device, dtype: torch.dtype) -> Any:
    """(tokenizer, model) of an AutoModelForSequenceClassification directory or hub name, in
    eval mode on `device`, with a pad token on both."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"cannot load a sequence classifier from {path!r}: {e}") from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device).eval().requires_grad_(False)
    return tokenizer, model


def context_tokens(tokenizer: Any, model: Any, max_tokens: int | None = None) -> int:
    """The longest input both the tokenizer and the model take (and `max_tokens`, if set)."""
    limits = [tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None)]
    limits.append(max_tokens)
    return int(min(limit for limit in limits if limit is not None and limit > 0))


def _by_length(rows: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Row indices in batches of similar lengths (less compute spent on padding)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _fallback_token(tokenizer: Any) -> int:
    """What an empty text becomes, so that every row has a token to attend to."""
    for token in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id):
        if token is not None:
            return int(token)
    raise InvalidArgumentError("the tokenizer has no EOS, BOS or pad token")


class RewardModel:
    """A reward model's score of each text: output `label` at the last token of the text.

    Rows are left-padded and passed as embeddings, so transformers pools the last column, the
    last real token of every row; with token ids it would look for the last token that is
    not the pad id, which fails where pad and EOS are one token and the text ends with EOS.
    Meant for decoder-only reward models (every RLHF reward model in use)."""

    def __init__(
        self,
        path: str,
        label: int = 0,
        batch_size: int = 16,
        max_tokens: int | None = None,
        append_eos: bool = False,
        device: str = "auto",
        dtype: str = "auto",
    ) -> None:
        self.device = pick_device(device)
        self.tokenizer, self.model = load_sequence_classifier(
            path, self.device, pick_dtype(dtype, self.device)
        )
        labels = self.model.config.num_labels
        if not 0 <= label < labels:
            raise InvalidArgumentError(f"reward label {label}: {path} has {labels} outputs")
        if append_eos and self.tokenizer.eos_token_id is None:
            raise InvalidArgumentError(f"append_eos: the tokenizer of {path} has no EOS token")
        self.label = label
        self.batch_size = batch_size
        self.append_eos = append_eos
        self.max_tokens = context_tokens(self.tokenizer, self.model, max_tokens)
        # Its warning that embeddings hide the padding is what this class relies on.
        logging.getLogger(type(self.model).__module__).addFilter(_EmbeddingsPaddingWarning())

    def score(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        rows = [self._tokens(text) for text in texts]
        scores = [0.0] * len(rows)
        with torch.no_grad():
            for batch in _by_length(rows, self.batch_size):
                values = self._forward([rows[i] for i in batch])
                for i, value in zip(batch, values, strict=True):
                    scores[i] = value
        return scores

    def _tokens(self, text: str) -> list[int]:
        ids = list(self.tokenizer(text)["input_ids"]) or [_fallback_token(self.tokenizer)]
        eos = self.tokenizer.eos_token_id
        # A text may already end with it (reference responses often carry the EOS string).
        if self.append_eos and ids[-1] != eos:
            ids.append(eos)
        # The score is read at the end: a text too long loses its start.
        return ids[-self.max_tokens :]

    def _forward(self, rows: list[list[int]]) -> list[float]:
        inputs = padded(rows, self.tokenizer.pad_token_id, left=True, device=self.device)
        embeddings = self.model.get_input_embeddings()(inputs.pop("input_ids"))
        logits = self.model(inputs_embeds=embeddings, **inputs).logits
        return [float(v) for v in logits[:, self.label].float().cpu()]


class _EmbeddingsPaddingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "inputs_embeds" not in record.getMessage()


class LabelClassifier:
    """log p(label | text) under a sequence classifier, its own pooling (first token for
    encoders such as RoBERTa, last for decoders) on right-padded rows."""

    def __init__(
        self,
        path: str,
        label: str,
        batch_size: int = 64,
        device: str = "auto",
        dtype: str = "auto",
    ) -> None:
        self.device = pick_device(device)
        self.tokenizer, self.model = load_sequence_classifier(
            path, self.device, pick_dtype(dtype, self.device)
        )
        self.label_index = resolve_label(self.model.config, label, path)
        self.batch_size = batch_size
        self.max_tokens = context_tokens(self.tokenizer, self.model)

    def label_logprobs(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_tokens)
        fallback = _fallback_token(self.tokenizer)
        rows = [list(ids) or [fallback] for ids in encoded["input_ids"]]
        values = [0.0] * len(rows)
        with torch.no_grad():
            for batch in _by_length(rows, self.batch_size):
                inputs = padded(
                    [rows[i] for i in batch],
                    self.tokenizer.pad_token_id,
                    left=False,
                    device=self.device,
                )
                logits = self.model(**inputs).logits.float()
                logprobs = logits.log_softmax(dim=-1)[:, self.label_index].cpu()
                for i, value in zip(batch, logprobs.tolist(), strict=True):
                    values[i] = value
        return values


def resolve_label(config: Any, label: str, path: str) -> int:
    """The index of `label`: a name in the config's id2label, or an index."""
    names = {str(name): int(index) for index, name in config.id2label.items()}
    if label in names:
        return names[label]
    if label.isdigit() and int(label) < config.num_labels:
        return int(label)
    known = ", ".join(f"{index}={name}" for index, name in sorted(config.id2label.items()))
    raise InvalidArgumentError(f"label {label!r} is not a class of {path} ({known})")
