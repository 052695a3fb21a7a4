"""Settings of the trainer (`tba trainer run`): `[trainer]`, `[optim]`, `[checkpoint]`,
`[metrics]` and `[distributed]`; `[model]` is `tba.models.config.ModelSettings`. The root
settings of the command (`TrainerRunSettings`) name every section the trainer reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tba.buffer.config import BufferClientSettings
from tba.models.config import DeviceName, ModelSettings
from tba.objectstore.config import ObjectStoreSettings
from tba.searcher.config import SearcherSettings
from tba.settings import CommandSettings, Section
from tba.tasks.config import TaskSettings
from tba.wandb_sink import WandbSettings


class TrainerSettings(Section):
    """`[trainer]`: what a step samples, the objective, and how often weights go out."""

    steps: int = Field(500, ge=1, le=10_000_000, description="Optimizer steps to train.")
    num_prompts: int = Field(7, ge=1, le=4096, description="B: prompt groups per batch.")
    samples_per_prompt: int = Field(
        20, ge=1, le=1024, description="K: completions per prompt group."
    )
    min_samples_per_prompt: int = Field(
        2,
        ge=1,
        le=1024,
        description="Groups with fewer completions are not sampled (log Z needs two).",
    )
    min_batch_prompts: int = Field(
        1,
        ge=1,
        le=4096,
        description="Fewest groups a batch needs; smaller draws wait for the buffer to fill.",
    )
    initial_buffer_completions: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Before its first step a fresh run waits until the buffer holds this many "
        "completions (a run resumed past step 0 does not wait); 0 off. Keep it within what "
        "the buffer can hold (`[buffer] capacity`, and per prompt `prompt_history`) or the "
        "wait never ends. Paper: 500 (GSM8K), 10,000 (TL;DR).",
    )
    recency_probability: float = Field(
        0.95, ge=0.0, le=1.0, description="m: probability a group is drawn by recency."
    )
    reward_temperature: float | None = Field(
        None,
        gt=0.0,
        description="tau of reward-priority sampling, softmax(reward / tau); unset is uniform.",
    )
    max_age_versions: int | None = Field(
        None, ge=0, le=1_000_000, description="Never train on completions older than this."
    )
    micro_batch_size: int = Field(
        20, ge=1, le=65_536, description="Trajectories per forward/backward pass."
    )
    temperature: float | None = Field(
        None,
        gt=0.0,
        le=100.0,
        description="Deprecated: the sampling temperature is `[searcher] temperature`, which "
        "the trainer divides logits by. Accepted when equal to it; unset by default.",
    )
    objective: Literal["tb", "rloo", "grpo", "online_dpo"] = Field(
        "tb",
        description="`tb` (Trajectory Balance), or a baseline on the same data: `rloo`, "
        "`grpo` (group-normalised advantages, clipped ratio) or `online_dpo` (best vs worst "
        "completion of each group); formulas in `tba.trainer.loss` and `tba.trainer.objectives`.",
    )
    grpo_clip_epsilon: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="`grpo`: the ratio exp(log pi_theta - log pi_behaviour) is clipped to "
        "[1 - epsilon, 1 + epsilon] in the surrogate.",
    )
    beta_start: float = Field(0.014, gt=0.0, le=1e4, description="KL coefficient at step 0.")
    beta_end: float = Field(
        0.004, gt=0.0, le=1e4, description="KL coefficient after `beta_anneal_steps` (or the cut)."
    )
    beta_anneal_steps: int = Field(
        500, ge=0, le=10_000_000, description="Steps of linear beta anneal; 0 keeps beta_start."
    )
    beta_cut_step: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="From this step on (counted from 1, as the metrics log steps) beta is "
        "`beta_end`, wherever the anneal is; 0 never cuts. The paper's TL;DR: 1 -> 0.05 "
        "annealed over 128 steps, cut at step 32.",
    )
    prior_temperature_start: float = Field(
        1.0,
        gt=0.0,
        le=100.0,
        description="`tb`: gamma at step 0, the temperature of the reference prior in the "
        "target (log pi_ref / gamma + r / beta) / T of Lee et al. (2024); 1 with `end` 1 "
        "keeps today's target log pi_ref + r / beta. Their `lm_sched_start`.",
    )
    prior_temperature_end: float = Field(
        1.0,
        gt=0.0,
        le=100.0,
        description="`tb`: gamma after `prior_temperature_anneal_steps` (their `lm_sched_end`; "
        "paper, large red-teaming: 1.2).",
    )
    prior_temperature_anneal_steps: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="`tb`: steps of linear gamma anneal; 0 keeps `prior_temperature_start` "
        "(their `lm_sched_horizon`; paper, large red-teaming: 2,000).",
    )
    target_temperature_start: float = Field(
        1.0,
        gt=0.0,
        le=100.0,
        description="`tb`: T at step 0, the temperature of the whole target (log pi_ref / "
        "gamma + r / beta) / T, prior included (the beta schedule tempers only r): Lee et "
        "al.'s reward schedule, `reward_sched_start` (their default 2).",
    )
    target_temperature_end: float = Field(
        1.0,
        gt=0.0,
        le=100.0,
        description="`tb`: T after `target_temperature_anneal_steps` (`reward_sched_end`, 1).",
    )
    target_temperature_anneal_steps: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="`tb`: steps of linear T anneal; 0 keeps `target_temperature_start` "
        "(`reward_sched_horizon`; paper, large red-teaming: 1,000).",
    )
    importance_weights: bool = Field(
        False,
        description="`tb`, `rloo`: weight each trajectory by its clipped importance ratio. "
        "Ignored, with a warning, by `grpo` (it clips its own ratio, `grpo_clip_epsilon`) and "
        "`online_dpo`.",
    )
    importance_clip_level: Literal["sequence", "token"] = Field(
        "sequence",
        description="With `importance_weights`: clip the sequence's ratio exp(log pi_theta - "
        "log pi_behaviour), or (`token`) each token's, a trajectory weighing the mean of its "
        "tokens' clipped ratios (log Z weighted alike). `token` needs per-token behaviour "
        "log-probs (`[searcher] token_logprobs`); a batch without them stops the trainer "
        "with an error.",
    )
    importance_weight_min: float = Field(
        0.0, ge=0.0, le=1e6, description="Lower clip of exp(log pi_theta - log pi_behaviour)."
    )
    importance_weight_max: float = Field(
        2.0, gt=0.0, le=1e6, description="Upper clip of exp(log pi_theta - log pi_behaviour)."
    )
    reference_reset_steps: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="rho: the reference becomes the current policy every rho steps; 0 never.",
    )
    publish_every_steps: int = Field(
        2, ge=1, le=1_000_000, description="k: publish and announce weights every k steps."
    )
    publish_initial: bool = Field(
        True, description="Publish the starting weights before the first step of a fresh run."
    )
    publish_in_background: bool = Field(
        True,
        description="The step only copies the weights (CPU, `[model] dtype`); a publisher "
        "thread writes and announces them while training goes on, the newest copy replacing "
        "one still waiting. `false`: the step waits for the whole publish (lockstep).",
    )
    keep_versions: int = Field(
        3, ge=1, le=10_000, description="Weight versions kept in the object store."
    )
    publish_retries: int = Field(
        10,
        ge=0,
        le=1000,
        description="Retries of a weight publish while the object store is unreachable "
        "(each a warning); then, publishing in the background, the failure is counted and "
        "training goes on (the next snapshot is published); publishing synchronously, the "
        "trainer stops with an error. 10 ride out ~100 s.",
    )
    publish_retry_backoff_s: float = Field(
        1.0,
        gt=0.0,
        le=15.0,
        description="Wait before the first publish retry; doubles each retry up to 15 s.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of torch and of batch draws.")
    data_poll_s: float = Field(
        0.5, gt=0.0, le=600.0, description="Wait between draws while the buffer is too empty."
    )
    sample_wait_s: float = Field(
        1.0,
        ge=0.0,
        le=60.0,
        description="Longest one Sample call waits in the buffer for `min_batch_prompts` "
        "groups, woken by the searchers' adds (a long poll); 0: every call answers at once "
        "and the trainer polls every `data_poll_s`, as it does with a buffer that predates "
        "the long poll.",
    )
    data_timeout_s: float = Field(
        0.0, ge=0.0, le=604_800.0, description="Give up after waiting this long; 0 waits on."
    )
    device: DeviceName = Field(
        "auto", description="`auto` takes CUDA when present (the local rank's GPU)."
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> TrainerSettings:
        if self.importance_weight_min >= self.importance_weight_max:
            raise ValueError("importance_weight_min must be below importance_weight_max")
        clipped = self.importance_weights and self.objective in ("tb", "rloo")
        if self.importance_clip_level == "token" and not clipped:
            raise ValueError(
                'importance_clip_level = "token" needs importance_weights = true and '
                'objective "tb" or "rloo"'
            )
        if self.min_batch_prompts > self.num_prompts:
            # No draw of num_prompts groups ever holds more: the trainer would wait forever.
            raise ValueError("min_batch_prompts must be at most num_prompts")
        if self.objective != "tb" and self.tempers_target():
            # Only TB's target has a prior term to temper; the others would ignore them.
            raise ValueError("prior_temperature_* and target_temperature_* need objective = tb")
        return self

    def tempers_target(self) -> bool:
        """Whether the prior or target temperature is ever other than 1."""
        temperatures = (
            self.prior_temperature_start,
            self.prior_temperature_end,
            self.target_temperature_start,
            self.target_temperature_end,
        )
        return any(t != 1.0 for t in temperatures)


class OptimSettings(Section):
    """`[optim]`: AdamW and the learning-rate schedule."""

    lr: float = Field(1e-5, gt=0.0, le=1.0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0.0, le=1.0, description="AdamW epsilon.")
    schedule: Literal["constant", "cosine", "wsd"] = Field(
        "constant", description="`constant`, `cosine`, or `wsd` (warmup-stable-decay)."
    )
    warmup_steps: int = Field(
        0, ge=0, le=10_000_000, description="Steps of linear warmup from 0 to `lr`."
    )
    decay_steps: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="`wsd`: final steps of linear decay. `cosine`: steps after the warmup to "
        "fall to `min_lr_ratio` and stay (0: the whole run).",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="Final learning rate of `cosine`/`wsd`, times `lr`."
    )
    decay_by: Literal["steps", "reward"] = Field(
        "steps",
        description="What the `cosine` decay follows. `steps`: `decay_steps`. `reward`: the "
        "trained batches' mean reward (averaged over `reward_average_steps`) as it climbs from "
        "`reward_decay_from` to `reward_decay_to`, so a run that learns slowly keeps its peak "
        "rate until it improves; the rate never rises again.",
    )
    reward_decay_from: float = Field(
        0.6, ge=-1e6, le=1e6, description="`decay_by = reward`: mean reward where decay starts."
    )
    reward_decay_to: float = Field(
        0.9, ge=-1e6, le=1e6, description="`decay_by = reward`: mean reward of `min_lr_ratio`."
    )
    reward_average_steps: int = Field(
        50,
        ge=1,
        le=1_000_000,
        description="`decay_by = reward`: steps the reward mean is averaged over (exponential).",
    )
    max_grad_norm: float = Field(
        1.0, ge=0.0, le=1e6, description="Clip the global gradient norm to this; 0 off."
    )

    @model_validator(mode="after")
    def _check_reward_decay(self) -> OptimSettings:
        if self.decay_by == "reward":
            if self.schedule != "cosine":
                raise ValueError("decay_by = reward needs schedule = cosine")
            if self.reward_decay_from >= self.reward_decay_to:
                raise ValueError("reward_decay_from must be below reward_decay_to")
        return self


class CheckpointSettings(Section):
    """`[checkpoint]`: training state to resume from."""

    dir: str = Field(
        "runs/checkpoints", min_length=1, max_length=4096, description="Checkpoint folder."
    )
    every_steps: int = Field(
        50, ge=0, le=10_000_000, description="Checkpoint every this many steps; 0 only at end."
    )
    keep_last: int = Field(2, ge=1, le=1000, description="Checkpoints kept.")
    resume: bool = Field(True, description="Continue from the newest checkpoint in `dir`.")


class MetricsSettings(WandbSettings):
    """`[metrics]`: where step metrics go (wandb's fields: `tba.wandb_sink`)."""

    stdout: bool = Field(True, description="Print one line of metrics per logged step.")
    jsonl_path: str | None = Field(
        None, max_length=4096, description="Append one JSON object per logged step here."
    )
    log_every_steps: int = Field(1, ge=1, le=1_000_000, description="Log every n steps.")
    prometheus_port: int | None = Field(
        None, ge=0, le=65_535, description="Serve Prometheus /metrics here; unset off."
    )
    prometheus_host: str = Field("127.0.0.1", description="Address of the /metrics server.")
    tensorboard_dir: str | None = Field(
        None, max_length=4096, description="Write TensorBoard events here (needs tensorboard)."
    )


class DistributedSettings(Section):
    """`[distributed]`: data-parallel training with DeepSpeed ZeRO under its launcher."""

    backend: Literal["none", "deepspeed"] = Field(
        "none", description="`deepspeed` under `deepspeed`/`torchrun`, else one process."
    )
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    comm_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; `auto`: nccl on GPUs, gloo on CPU."
    )


def check_posted_choice(trainer: TrainerSettings, searcher: SearcherSettings) -> None:
    """Completions chosen by reward (`searcher.post_per_prompt`) leave TB's target as it is
    but bias the other objectives' estimates, which assume the group is what was sampled."""
    if searcher.post_per_prompt and trainer.objective != "tb":
        raise ValueError(
            f"searcher.post_per_prompt ({searcher.post_per_prompt}) posts the completions "
            f"that spread each group's rewards most, which biases objective "
            f"{trainer.objective!r}: set searcher.post_per_prompt = 0 with it (and "
            "searcher.samples_per_prompt to the trainer's, to generate only what it trains on)"
        )


class TrainerRunSettings(CommandSettings):
    trainer: TrainerSettings = TrainerSettings()
    model: ModelSettings = ModelSettings()
    optim: OptimSettings = OptimSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    metrics: MetricsSettings = MetricsSettings()
    distributed: DistributedSettings = DistributedSettings()
    objectstore: ObjectStoreSettings = ObjectStoreSettings()
    client: BufferClientSettings = BufferClientSettings()
    # The run's generation settings (the sampling temperature, which the trainer divides
    # logits by, and the completion length) and its task: one definition for both sides.
    searcher: SearcherSettings = SearcherSettings()
    task: TaskSettings = TaskSettings()

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainerRunSettings:
        zero3 = self.distributed.backend == "deepspeed" and self.distributed.zero_stage == 3
        if zero3 and self.trainer.reference_reset_steps > 0:
            raise ValueError("reference resets need full weights on each rank: not with ZeRO-3")
        deprecated = self.trainer.temperature
        if deprecated is not None and deprecated != self.searcher.temperature:
            raise ValueError(
                f"trainer.temperature ({deprecated}, deprecated) differs from "
                f"searcher.temperature ({self.searcher.temperature}), the sampling temperature "
                "the trainer divides logits by: set only searcher.temperature"
            )
        check_posted_choice(self.trainer, self.searcher)
        return self

    @property
    def temperature(self) -> float:
        """The sampling temperature: log-probs are of logits / temperature."""
        return self.searcher.temperature
