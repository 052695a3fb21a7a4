"""Settings of `tba local`: `[local]` (the run), `[bootstrap]` (the demo's own base model), and
the settings of the arithmetic demo on 2 CPU cores (`demo_sections`), which `tba local` runs
when no run file is given (configs/arithmetic-demo.toml holds the same). Each child gets its
sections as a TOML run config in the run directory. `LocalRunSettings` is the root."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tba.buffer.config import BufferSettings
from tba.models.config import ModelSettings
from tba.objectstore.config import ObjectStoreSettings
from tba.searcher.config import EngineSettings, SearcherSettings
from tba.settings import CommandSettings, Section
from tba.tasks.config import TaskSettings
from tba.trainer.config import OptimSettings, TrainerSettings, check_posted_choice


class LocalSettings(Section):
    """`[local]`: one machine, every service as its own process."""

    run_dir: str = Field(
        "runs/local",
        min_length=1,
        max_length=4096,
        description="Folder of everything a run writes.",
    )
    mode: Literal["async", "sync"] = Field(
        "async",
        description="`async`: TBA. `sync`: the on-policy baseline on the same code (k=1, m=1, "
        "only the newest version trained on, searchers wait while the trainer trains).",
    )
    searchers: int = Field(1, ge=1, le=64, description="Searcher processes.")
    model: str | None = Field(
        None,
        max_length=4096,
        description="A base model directory; unset: `[model] source` (for arithmetic, "
        "`tiny` means the demo's base, see `base`).",
    )
    base: Literal["committed", "bootstrap"] = Field(
        "committed",
        description="Base of the arithmetic demo when `model` is unset. `committed`: the one "
        "shipped with tba (sha256-checked), the same on every machine. `bootstrap`: pre-train "
        "a tiny one here with `[bootstrap]` (cached in the run directory); where it lands "
        "differs between CPUs, and so does how fast RL learns from it.",
    )
    eval_prompts: int = Field(
        500, ge=1, le=100_000, description="Held-out prompts scored greedily for accuracy."
    )
    eval_interval_s: float = Field(
        5.0, gt=0.0, le=3600.0, description="Least time between evaluations of new versions."
    )
    threads_per_process: int = Field(
        1, ge=1, le=256, description="torch threads of each child (2 cores: 1 each is best)."
    )
    start_method: Literal["auto", "fork", "exec"] = Field(
        "auto",
        description="How the services start. `fork`: forked from this process, which has "
        "imported torch and transformers already, so each is up in about a second. `exec`: "
        "each a new `python -m tba` process, which imports them itself (5-8 s on 2 cores). "
        "`auto`: fork where the OS can and `threads_per_process` is 1, else exec.",
    )
    evaluator_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="Niceness this process (evaluation, progress) takes once the services "
        "run, so that measuring takes CPU the trainer and searchers leave over (a point's "
        "time is its version's publication, however late it is scored).",
    )
    stop_at_accuracy: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="End the run at the first evaluation whose held-out accuracy reaches this "
        "(0: always run all `trainer.steps`).",
    )
    progress: bool = Field(True, description="Show a live progress bar.")
    start_timeout_s: float = Field(
        300.0, gt=0.0, le=3600.0, description="Longest wait for a service to become ready."
    )


class BootstrapSettings(Section):
    """`[bootstrap]`: the tiny char-level GPT-2 the demo pre-trains itself (supervised, seeded,
    cached in the run directory) to a modest accuracy that leaves room for RL."""

    chars: str = Field("0123456789+=", min_length=1, description="The tokenizer's characters.")
    n_layer: int = Field(3, ge=1, le=48, description="Layers.")
    n_embd: int = Field(128, ge=8, le=4096, description="Width.")
    n_head: int = Field(4, ge=1, le=64, description="Attention heads.")
    n_positions: int = Field(32, ge=8, le=4096, description="Context length.")
    steps: int = Field(
        2000,
        ge=0,
        le=1_000_000,
        description="Most supervised steps (all of them when `target_accuracy` is 0).",
    )
    target_accuracy: float = Field(
        0.4,
        ge=0.0,
        le=1.0,
        description="Stop at the first check whose greedy accuracy on the validation prompts "
        "reaches this (0: train all `steps`). The tiny model learns carrying in a sudden jump "
        "whose step count differs between machines; a target lands every machine at the same "
        "point of that jump, where RL has room and signal.",
    )
    check_every_steps: int = Field(
        5, ge=1, le=100_000, description="Supervised steps between validation checks."
    )
    validation_prompts: int = Field(
        200,
        ge=1,
        le=100_000,
        description="Train-split prompts held out of the supervised data to choose when to stop "
        "(the test split stays unseen).",
    )
    batch_size: int = Field(64, ge=1, le=65_536, description="Prompts per supervised step.")
    lr: float = Field(1e-3, gt=0.0, le=1.0, description="AdamW learning rate.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of weights and batches.")


def demo_sections() -> dict[str, Any]:
    """The demo's sections, as a run file would give them: the values its services' defaults
    do not have."""
    return {
        "trainer": demo_trainer().model_dump(exclude_unset=True),
        "optim": demo_optim().model_dump(exclude_unset=True),
        "searcher": demo_searcher().model_dump(exclude_unset=True),
        # Completions of a 2-digit sum repeat often: de-duplication would leave one copy of
        # the right answer per prompt and starve the trainer of its reward signal. A recency
        # window of one searcher round trains on the newest completions only.
        "buffer": {"recency_window": 16, "dedup": False},
    }


def demo_trainer() -> TrainerSettings:
    return TrainerSettings(
        # A cap: the run ends when held-out accuracy reaches `local.stop_at_accuracy`.
        steps=8000,
        num_prompts=16,
        samples_per_prompt=8,
        min_samples_per_prompt=2,
        min_batch_prompts=8,
        # Staleness costs learning per step: in-process, training on completions 2 steps old
        # reached 0.53 held-out accuracy at step 500 where fresh ones reached 0.72, and
        # a 2-version cut ran 10% more steps a second but learned less. Publishing every step
        # and a 1-version cut keep every completion one step old.
        max_age_versions=1,
        # Completions one step old, weighted by their importance ratio under the current
        # policy (clipped to [0, 2]), learned per step about as fast as on-policy ones: 0.80
        # held-out accuracy at step 559 against 816-1,151 unweighted.
        importance_weights=True,
        recency_probability=0.95,
        micro_batch_size=128,
        beta_start=0.1,
        beta_end=0.1,
        beta_anneal_steps=0,
        publish_every_steps=1,
        # Lockstep with the searcher: announced in the background, a version came after the
        # next step had drawn, and 0.90 took 3,068-3,160 steps instead of 2,041-2,157 (two
        # seeds each); a synchronous publish of the tiny model blocks about 20 ms a step.
        publish_in_background=False,
        keep_versions=3,
        # The trainer waits on each newest round, woken by its post (the Sample long poll);
        # against a buffer without one, a short poll keeps that wait near the round's own
        # latency (0.1 s cost 0.05 s a step on average, a quarter of a step).
        data_poll_s=0.01,
    )


def demo_searcher() -> SearcherSettings:
    return SearcherSettings(
        prompts_per_round=16,
        # S 16 generated a prompt, the K 8 that spread its rewards most posted: from the hard
        # bases a right answer is rare, and a group trains TB only if it holds one. With a
        # prompt's agreeing samples sharing a forward, 16 cost little more than 8; to 0.80
        # from the hard bases, six pairs: median 182 s, worst 214 s against 212 s and 242 s
        # (docs/benchmarks.md). For TB only: chosen by reward, they would bias the others.
        samples_per_prompt=16,
        post_per_prompt=8,
        max_new_tokens=5,
        # The run's one sampling temperature: the trainer divides logits by it too.
        temperature=1.0,
        drop_duplicates=False,
        # Rounds beyond one per version were never trained on (the trainer draws only the
        # newest round; the searcher made 2.2 per step) and took CPU the trainer needed: one
        # per version ran 30% more trainer steps a second on 2 cores.
        one_round_per_version=True,
        # A prompt whose last group settled (all right, or all wrong) is passed over at its
        # next 3 leases: from the hard bases 0.80 took a fifth fewer steps from hard-1 and
        # about as many from hard-2 (3 RL seeds each, docs/benchmarks.md).
        settled_prompt_passes=3,
        idle_poll_s=0.01,
        # A round's 128 posted completions in one reference pass: this tiny model's forward costs
        # per call more than per token; in the demo four passes of 32 took 1.3x one of 128,
        # and the trainer ran 8-15% more steps a second (docs/benchmarks.md).
        reference_batch_size=128,
    )


def demo_optim() -> OptimSettings:
    # A peak of 1.5e-4 (2e-4 swings at 0.5-0.7 held-out accuracy, update noise), decayed by
    # the batches' reward, not by steps: a cosine over the first 2,500 steps climbed through
    # 0.80 near step 900 from a friendly base but left a hard one (bench/bases/hard-1) below
    # 0.70, its rate spent; keyed to reward (0.7 -> 0.95) that base reached 0.90 at step
    # 5,914 and the demo's own base still reached it by step 2,400 (docs/benchmarks.md).
    return OptimSettings(
        lr=1.5e-4,
        schedule="cosine",
        decay_by="reward",
        reward_decay_from=0.7,
        reward_decay_to=0.95,
        min_lr_ratio=0.05,
        max_grad_norm=1.0,
    )


class LocalRunSettings(CommandSettings):
    """The services' own defaults, so that a run file means the same to `tba local` as to
    each service; with no run file, the arithmetic demo's settings (`demo_sections`)."""

    local: LocalSettings = LocalSettings()
    bootstrap: BootstrapSettings = BootstrapSettings()
    task: TaskSettings = TaskSettings()
    trainer: TrainerSettings = TrainerSettings()
    optim: OptimSettings = OptimSettings()
    searcher: SearcherSettings = SearcherSettings()
    engine: EngineSettings = EngineSettings()
    # One machine's buffer, on ports free at the time (the children are told its address).
    buffer: BufferSettings = BufferSettings(grpc_port=0, http_port=0)
    objectstore: ObjectStoreSettings = ObjectStoreSettings()
    model: ModelSettings = ModelSettings()

    @classmethod
    def without_run_file(cls) -> dict[str, Any]:
        return demo_sections()

    @model_validator(mode="after")
    def _run_paths(self) -> LocalRunSettings:
        if "uri" not in self.objectstore.model_fields_set:
            self.objectstore.uri = f"file://{self.local.run_dir}/weights"
        return self

    @model_validator(mode="after")
    def _check_combinations(self) -> LocalRunSettings:
        # Before any child starts, not in the trainer's log.
        check_posted_choice(self.trainer, self.searcher)
        return self
