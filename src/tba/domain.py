"""Domain types shared by every service. Transports convert to and from these."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tba.runs import Run

TOKEN_DTYPE = np.dtype("<u4")
# Per-token log-probs: float32 keeps 7 digits, far finer than sampling noise, at 4 bytes a token.
LOGPROB_DTYPE = np.dtype("<f4")
# The highest sampling temperature any setting or trajectory may hold.
MAX_SAMPLING_TEMPERATURE = 100.0


def pack_tokens(token_ids: npt.ArrayLike) -> bytes:
    """Token ids as packed little-endian uint32, the wire and storage format."""
    return np.asarray(token_ids, dtype=TOKEN_DTYPE).tobytes()


def unpack_tokens(packed: bytes) -> npt.NDArray[np.uint32]:
    if len(packed) % TOKEN_DTYPE.itemsize:
        raise ValueError(f"packed token ids have {len(packed)} bytes, not a multiple of 4")
    return np.frombuffer(packed, dtype=TOKEN_DTYPE)


def pack_logprobs(logprobs: npt.ArrayLike) -> bytes:
    """Per-token log-probs as packed little-endian float32, the wire and storage format."""
    return np.asarray(logprobs, dtype=LOGPROB_DTYPE).tobytes()


def unpack_logprobs(packed: bytes) -> npt.NDArray[np.float32]:
    if len(packed) % LOGPROB_DTYPE.itemsize:
        raise ValueError(f"packed log-probs have {len(packed)} bytes, not a multiple of 4")
    return np.frombuffer(packed, dtype=LOGPROB_DTYPE)


def new_request_id() -> str:
    """An AddTrajectories request id, minted by whoever makes the batch: new for each batch,
    the same for all its retries, so that the buffer stores a batch once."""
    return uuid.uuid4().hex


class FinishReason(enum.IntEnum):
    UNSPECIFIED = 0
    STOP = 1
    LENGTH = 2


class SampleSource(enum.IntEnum):
    UNSPECIFIED = 0
    RECENCY = 1
    REWARD = 2


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    text: str
    answer: str = ""


@dataclass(slots=True)
class Trajectory:
    """One scored completion of a prompt. `ref_logprob` and `behavior_logprob` are sums over
    completion tokens (what the TB loss uses); `*_token_logprobs`, when the searcher sent them,
    are the same log-probs per completion token (`pack_logprobs`), empty otherwise. Every
    log-prob is of logits / `sampling_temperature`, the temperature the completion was
    sampled at; 0 means the run's (`[searcher] temperature`)."""

    prompt_id: str
    prompt_token_ids: bytes
    completion_token_ids: bytes
    completion_text: str
    reward: float
    ref_logprob: float
    behavior_logprob: float
    policy_version: int
    searcher_id: str = ""
    finish_reason: FinishReason = FinishReason.UNSPECIFIED
    created_at_s: float = 0.0
    id: int = 0
    behavior_token_logprobs: bytes = b""
    ref_token_logprobs: bytes = b""
    sampling_temperature: float = 0.0


@dataclass(frozen=True, slots=True)
class PromptGroup:
    """K completions of one prompt, the unit over which log Z is estimated."""

    prompt: Prompt
    trajectories: list[Trajectory]
    source: SampleSource


@dataclass(frozen=True, slots=True)
class TrainerReport:
    """The trainer's metrics of its latest step, sent along with a Sample request."""

    step: int
    loss: float
    kl: float
    log_z: float
    lr: float
    grad_norm: float
    step_time_s: float
    wait_data_s: float


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """What the trainer asks of the buffer: B prompts x up to K completions; `report`, the
    metrics of its latest step, rides along for the buffer's history. With `min_groups` and
    `wait_s` set, the buffer waits up to `wait_s` for a draw of `min_groups` groups (a long
    poll) instead of answering a smaller draw at once."""

    num_prompts: int
    samples_per_prompt: int
    recency_probability: float
    reward_temperature: float = float("inf")
    max_age_versions: int | None = None
    min_samples_per_prompt: int = 1
    seed: int | None = None
    report: TrainerReport | None = None
    min_groups: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Batch:
    groups: list[PromptGroup]
    latest_version: int
    # Seconds the buffer spent before the draw it answered with: a long poll's wait for data
    # and its draws of too few groups.
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: str
    prompts: list[Prompt]
    expires_at_s: float


@dataclass(frozen=True, slots=True)
class AddResult:
    accepted: int
    replaced_duplicates: int
    evicted: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class PutPromptsResult:
    prompt_ids: list[str]
    created: int


@dataclass(frozen=True, slots=True)
class WeightVersion:
    version: int
    uri: str
    sha256: str
    step: int
    published_at_s: float


@dataclass(frozen=True, slots=True)
class SearcherInfo:
    searcher_id: str
    last_seen_s: float
    trajectories_added: int


@dataclass(frozen=True, slots=True)
class BufferStats:
    trajectories: int
    prompts: int
    prompts_with_trajectories: int
    leases_in_flight: int
    reward_mean: float
    reward_histogram_edges: list[float]
    reward_histogram_counts: list[int]
    per_version: dict[int, int]
    latest_version: int
    searchers: list[SearcherInfo]
    trajectories_added_total: int
    groups_sampled_total: int
    evicted_total: int
    adds_per_s: float = 0.0
    samples_per_s: float = 0.0
    run: Run | None = None

    def staleness(self) -> dict[int, int]:
        """Trajectories per age, in versions behind the latest announced one."""
        ages: dict[int, int] = {}
        for version, count in self.per_version.items():
            age = max(0, self.latest_version - version)
            ages[age] = ages.get(age, 0) + count
        return dict(sorted(ages.items()))
