"""The transformers generation engine: KV-cached decoding of left-padded batches
(`tba.models.decode`), the CPU default for small runs and the fallback where vLLM is missing.

A prompt's `n` samples share its prefill, and each later forward runs the distinct contexts
still going, not every row: for the demo's 16 prompts x 8 samples, whose samples often agree,
a round generates in about 60% of the time of one row per sample, with the same tokens and
log-probs.

Sampling draws from the full distribution of logits / temperature (cut to the nucleus when
`top_p` < 1), whatever generation defaults the model's hub config names, and the behaviour
log-prob is read from that distribution. Only the drawn tokens' log-probs are kept, so a
chunk holds one step's logits at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from tba.domain import FinishReason, pack_logprobs
from tba.errors import InvalidArgumentError
from tba.models.decode import decode
from tba.models.device import pick_device, pick_dtype
from tba.models.generate import (
    cut_at_eos,
    eos_token_ids,
    pad_token_id,
    padded,
    seeded,
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
        max_new_tokens = params.max_new_tokens
        if self.context_tokens is not None:
            max_new_tokens = min(max_new_tokens, self.context_tokens - inputs["input_ids"].shape[1])
        out = decode(
            self.model,
            inputs,
            n=params.n,
            max_new_tokens=max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            eos_ids=self.eos_token_ids,
            pad_id=self.pad_token_id,
        )
        return self._completions(out.tokens.tolist(), out.logprobs.cpu(), params.n)

    def _completions(
        self, token_rows: list[list[int]], logprobs: torch.Tensor, n: int
    ) -> list[Completion]:
        """Row `i` is sample `i % n` of prompt `i // n`. A prompt's rows with the same tokens
        were one cache row all along (`decode`), so their log-probs are the same values:
        each distinct completion is built once."""
        built: dict[tuple[int, ...], Completion] = {}
        completions = []
        for row, tokens in enumerate(token_rows):
            # `kept` is this row's own list (`tolist` made one per row): no copy is needed.
            kept, stopped = cut_at_eos(tokens, eos_ids=self.eos_token_ids)
            key = (row // n, *kept)
            if key in built:
                completions.append(replace(built[key], token_ids=kept))
            else:
                built[key] = self._completion(kept, stopped, logprobs[row])
                completions.append(built[key])
        return completions

    def _completion(self, tokens: list[int], stopped: bool, logprobs: torch.Tensor) -> Completion:
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
