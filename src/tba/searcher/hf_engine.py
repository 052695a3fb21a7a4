"""The transformers generation engine: `generate` with a KV cache on left-padded batches, the
CPU default for small runs and the fallback where vLLM is missing.

A prompt's `n` samples share its prefill: the prompts (all but their last token) run once into
a KV cache that is then repeated `n` times, and `generate` continues from it; for the demo's
16 prompts x 8 samples a round generates in two thirds of the time, with the same tokens and
log-probs as a prefill of every row.

Sampling draws from the full distribution: `top_k=0` and `top_p` are passed explicitly and the
model's own generation defaults (repetition penalties, top-k 50, ...) are replaced by a neutral
config, so the behaviour log-prob, read from the processed scores `generate` sampled from, is
that of logits / temperature (truncated to the nucleus when `top_p` < 1). The scores of a
chunk are held until it ends: max_batch_sequences x max_new_tokens x vocabulary floats, so
keep chunks small for large vocabularies (vLLM is the engine for those).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tba.domain import FinishReason, pack_logprobs
from tba.errors import InvalidArgumentError
from tba.models.device import pick_device, pick_dtype
from tba.models.generate import (
    cut_at_eos,
    eos_token_ids,
    pad_token_id,
    padded,
    seeded,
    set_neutral_generation_config,
)
from tba.searcher.config import EngineSettings
from tba.searcher.engine import Completion, PreparedWeights, SamplingParams, check_request


class TransformersEngine:
    def __init__(self, model: Any, tokenizer: Any, settings: EngineSettings) -> None:
        self.device = pick_device(settings.device)
        dtype = pick_dtype(settings.dtype, self.device)
        self.model: Any = model.to(device=self.device, dtype=dtype)
        self.model.eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.max_batch_sequences = settings.max_batch_sequences
        self.eos_token_ids = eos_token_ids(tokenizer, model.config)
        self.pad_token_id = pad_token_id(tokenizer, self.eos_token_ids)
        self.context_tokens: int | None = getattr(model.config, "max_position_embeddings", None)
        set_neutral_generation_config(self.model, tokenizer, self.eos_token_ids, self.pad_token_id)
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        check_request(prompts, params, self.context_tokens)
        per_chunk = max(1, self.max_batch_sequences // params.n)
        flat: list[Completion] = []
        with torch.no_grad(), seeded(params.seed, self.device):
            for start in range(0, len(prompts), per_chunk):
                flat += self._generate_chunk(prompts[start : start + per_chunk], params)
        return [flat[i : i + params.n] for i in range(0, len(flat), params.n)]

    def _generate_chunk(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        inputs = padded(prompts, self.pad_token_id, left=True, device=self.device)
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        width = input_ids.shape[1]
        cache = self._prefill(inputs, params.n)
        max_new_tokens = params.max_new_tokens
        if self.context_tokens is not None:
            max_new_tokens = min(max_new_tokens, self.context_tokens - width)
        out = self.model.generate(
            input_ids=input_ids.repeat_interleave(params.n, dim=0),
            attention_mask=attention_mask.repeat_interleave(params.n, dim=0),
            past_key_values=cache,
            do_sample=True,
            temperature=params.temperature,
            top_k=0,
            top_p=params.top_p,
            max_new_tokens=max_new_tokens,
            return_dict_in_generate=True,
            output_scores=True,
        )
        new_tokens = out.sequences[:, width:]
        logprobs = torch.empty(new_tokens.shape, dtype=torch.float32, device=new_tokens.device)
        for step, scores in enumerate(out.scores):
            # One step at a time: a [rows, steps, vocabulary] stack would double the memory.
            step_logprobs = scores.float().log_softmax(dim=-1)
            picked = step_logprobs.gather(-1, new_tokens[:, step : step + 1])
            logprobs[:, step] = picked.squeeze(-1)
        return [
            self._completion(tokens, logps)
            for tokens, logps in zip(new_tokens.tolist(), logprobs.cpu(), strict=True)
        ]

    def _prefill(self, inputs: dict[str, torch.Tensor], n: int) -> Any:
        """The KV cache of each (left-padded) prompt but its last token, repeated for its `n`
        samples (None for prompts of one token: `generate` then starts from nothing)."""
        from transformers import DynamicCache

        if inputs["input_ids"].shape[1] < 2:
            return None
        cache = DynamicCache(config=self.model.config)
        self.model(
            input_ids=inputs["input_ids"][:, :-1],
            attention_mask=inputs["attention_mask"][:, :-1],
            position_ids=inputs["position_ids"][:, :-1],
            past_key_values=cache,
            use_cache=True,
        )
        cache.batch_repeat_interleave(n)
        return cache

    def _completion(self, tokens: list[int], logprobs: torch.Tensor) -> Completion:
        tokens, stopped = cut_at_eos(tokens, eos_ids=self.eos_token_ids)
        finish = FinishReason.STOP if stopped else FinishReason.LENGTH
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        kept = logprobs[: len(tokens)]
        # The sum as before (float32, in torch); the tokens are the values it adds.
        behavior_logprob = float(kept.sum())
        return Completion(tokens, text, behavior_logprob, finish, pack_logprobs(kept.numpy()))

    def prepare_weights(self, weights_dir: Path) -> PreparedWeights:
        """Reads the safetensors of a `save_pretrained` directory into new tensors of the
        model's dtype, on its device, checked against its parameters; the model is untouched.
        Until swapped in they are a second copy of the weights. Files that do not fit the
        model raise InvalidArgumentError."""
        from safetensors.torch import load_file

        files = sorted(Path(weights_dir).glob("*.safetensors"))
        if not files:
            raise InvalidArgumentError(f"no .safetensors files in {weights_dir}")
        tensors: dict[str, torch.Tensor] = {}
        for path in files:
            tensors.update(load_file(path))
        state = self.model.state_dict()
        _check_fits(tensors, state, weights_dir)
        ready = {
            name: tensor.to(device=state[name].device, dtype=state[name].dtype)
            for name, tensor in tensors.items()
        }
        return PreparedWeights(Path(weights_dir), _with_tied(ready, state))

    def swap_weights(self, prepared: PreparedWeights, version: int) -> None:
        """Points the model's parameters at the prepared tensors instead of copying them, so
        the pause does not grow with the model; the old tensors are freed."""
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets |= dict(self.model.named_buffers(remove_duplicate=False))
        for name, tensor in prepared.tensors.items():
            targets[name].data = tensor
        self._version = version

    def load_weights(self, weights_dir: Path, version: int) -> None:
        self.swap_weights(self.prepare_weights(weights_dir), version)

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _check_fits(
    tensors: dict[str, torch.Tensor], state: dict[str, torch.Tensor], source: Path
) -> None:
    unknown = sorted(set(tensors) - set(state))
    wrong_shape = sorted(
        k for k in tensors.keys() & state.keys() if tensors[k].shape != state[k].shape
    )
    # Tied weights (GPT-2's lm_head) are saved once: a key sharing storage with a loaded one
    # is not missing.
    loaded = {state[k].data_ptr() for k in tensors.keys() & state.keys()}
    missing = sorted(k for k in state if k not in tensors and state[k].data_ptr() not in loaded)
    if unknown or wrong_shape or missing:
        raise InvalidArgumentError(
            f"weights in {source} do not fit the model: unknown {unknown[:5]}, "
            f"wrong shape {wrong_shape[:5]}, missing {missing[:5]}"
        )


def _with_tied(
    ready: dict[str, torch.Tensor], state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """`ready` plus every model key tied to one of its keys (sharing its storage, saved once)
    mapped to the same tensor: a tie kept as two parameters then stays a tie after the swap."""
    by_storage = {state[name].data_ptr(): tensor for name, tensor in ready.items()}
    tied = {
        name: by_storage[t.data_ptr()]
        for name, t in state.items()
        if name not in ready and t.data_ptr() in by_storage
    }
    return ready | tied
