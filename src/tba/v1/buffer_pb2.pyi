from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]

class SampleSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLE_SOURCE_UNSPECIFIED: _ClassVar[SampleSource]
    SAMPLE_SOURCE_RECENCY: _ClassVar[SampleSource]
    SAMPLE_SOURCE_REWARD: _ClassVar[SampleSource]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
SAMPLE_SOURCE_UNSPECIFIED: SampleSource
SAMPLE_SOURCE_RECENCY: SampleSource
SAMPLE_SOURCE_REWARD: SampleSource

class Prompt(_message.Message):
    __slots__ = ("id", "text", "answer")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    answer: str
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("id", "prompt_id", "prompt_token_ids", "completion_token_ids", "completion_text", "reward", "ref_logprob", "behavior_logprob", "policy_version", "searcher_id", "finish_reason", "created_at_s", "behavior_token_logprobs", "ref_token_logprobs", "sampling_temperature")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TEXT_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REF_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEARCHER_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_S_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REF_TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    id: int
    prompt_id: str
    prompt_token_ids: bytes
    completion_token_ids: bytes
    completion_text: str
    reward: float
    ref_logprob: float
    behavior_logprob: float
    policy_version: int
    searcher_id: str
    finish_reason: FinishReason
    created_at_s: float
    behavior_token_logprobs: bytes
    ref_token_logprobs: bytes
    sampling_temperature: float
    def __init__(self, id: _Optional[int] = ..., prompt_id: _Optional[str] = ..., prompt_token_ids: _Optional[bytes] = ..., completion_token_ids: _Optional[bytes] = ..., completion_text: _Optional[str] = ..., reward: _Optional[float] = ..., ref_logprob: _Optional[float] = ..., behavior_logprob: _Optional[float] = ..., policy_version: _Optional[int] = ..., searcher_id: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., created_at_s: _Optional[float] = ..., behavior_token_logprobs: _Optional[bytes] = ..., ref_token_logprobs: _Optional[bytes] = ..., sampling_temperature: _Optional[float] = ...) -> None: ...

class PutPromptsRequest(_message.Message):
    __slots__ = ("prompts",)
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ...) -> None: ...

class PutPromptsResponse(_message.Message):
    __slots__ = ("prompt_ids", "created")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    created: int
    def __init__(self, prompt_ids: _Optional[_Iterable[str]] = ..., created: _Optional[int] = ...) -> None: ...

class LeasePromptsRequest(_message.Message):
    __slots__ = ("searcher_id", "max_prompts", "lease_s")
    SEARCHER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    searcher_id: str
    max_prompts: int
    lease_s: float
    def __init__(self, searcher_id: _Optional[str] = ..., max_prompts: _Optional[int] = ..., lease_s: _Optional[float] = ...) -> None: ...

class LeasePromptsResponse(_message.Message):
    __slots__ = ("lease_id", "prompts", "expires_at_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    expires_at_s: float
    def __init__(self, lease_id: _Optional[str] = ..., prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., expires_at_s: _Optional[float] = ...) -> None: ...

class AddTrajectoriesRequest(_message.Message):
    __slots__ = ("request_id", "searcher_id", "lease_id", "trajectories", "run_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SEARCHER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    searcher_id: str
    lease_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    run_id: str
    def __init__(self, request_id: _Optional[str] = ..., searcher_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., run_id: _Optional[str] = ...) -> None: ...

class AddTrajectoriesResponse(_message.Message):
    __slots__ = ("accepted", "replaced_duplicates", "evicted", "replayed")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REPLACED_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    replaced_duplicates: int
    evicted: int
    replayed: bool
    def __init__(self, accepted: _Optional[int] = ..., replaced_duplicates: _Optional[int] = ..., evicted: _Optional[int] = ..., replayed: _Optional[bool] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("num_prompts", "samples_per_prompt", "recency_probability", "reward_temperature", "max_age_versions", "min_samples_per_prompt", "seed", "trainer_report", "min_groups", "wait_s")
    NUM_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    RECENCY_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    REWARD_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TRAINER_REPORT_FIELD_NUMBER: _ClassVar[int]
    MIN_GROUPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    num_prompts: int
    samples_per_prompt: int
    recency_probability: float
    reward_temperature: float
    max_age_versions: int
    min_samples_per_prompt: int
    seed: int
    trainer_report: TrainerReport
    min_groups: int
    wait_s: float
    def __init__(self, num_prompts: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., recency_probability: _Optional[float] = ..., reward_temperature: _Optional[float] = ..., max_age_versions: _Optional[int] = ..., min_samples_per_prompt: _Optional[int] = ..., seed: _Optional[int] = ..., trainer_report: _Optional[_Union[TrainerReport, _Mapping]] = ..., min_groups: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class TrainerReport(_message.Message):
    __slots__ = ("step", "loss", "kl", "log_z", "lr", "grad_norm", "step_time_s", "wait_data_s")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    LOG_Z_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_DATA_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    loss: float
    kl: float
    log_z: float
    lr: float
    grad_norm: float
    step_time_s: float
    wait_data_s: float
    def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ..., kl: _Optional[float] = ..., log_z: _Optional[float] = ..., lr: _Optional[float] = ..., grad_norm: _Optional[float] = ..., step_time_s: _Optional[float] = ..., wait_data_s: _Optional[float] = ...) -> None: ...

class PromptGroup(_message.Message):
    __slots__ = ("prompt", "trajectories", "source")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    prompt: Prompt
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    source: SampleSource
    def __init__(self, prompt: _Optional[_Union[Prompt, _Mapping]] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., source: _Optional[_Union[SampleSource, str]] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("groups", "latest_version", "waited_s")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[PromptGroup]
    latest_version: int
    waited_s: float
    def __init__(self, groups: _Optional[_Iterable[_Union[PromptGroup, _Mapping]]] = ..., latest_version: _Optional[int] = ..., waited_s: _Optional[float] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SearcherInfo(_message.Message):
    __slots__ = ("searcher_id", "last_seen_s", "trajectories_added")
    SEARCHER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_ADDED_FIELD_NUMBER: _ClassVar[int]
    searcher_id: str
    last_seen_s: float
    trajectories_added: int
    def __init__(self, searcher_id: _Optional[str] = ..., last_seen_s: _Optional[float] = ..., trajectories_added: _Optional[int] = ...) -> None: ...

class VersionCount(_message.Message):
    __slots__ = ("policy_version", "trajectories")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    trajectories: int
    def __init__(self, policy_version: _Optional[int] = ..., trajectories: _Optional[int] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("trajectories", "prompts", "prompts_with_trajectories", "leases_in_flight", "reward_mean", "reward_histogram_edges", "reward_histogram_counts", "per_version", "latest_version", "adds_per_s", "samples_per_s", "searchers", "trajectories_added_total", "groups_sampled_total", "evicted_total", "run")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_WITH_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    LEASES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_HISTOGRAM_EDGES_FIELD_NUMBER: _ClassVar[int]
    REWARD_HISTOGRAM_COUNTS_FIELD_NUMBER: _ClassVar[int]
    PER_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    SEARCHERS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_ADDED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GROUPS_SAMPLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVICTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    trajectories: int
    prompts: int
    prompts_with_trajectories: int
    leases_in_flight: int
    reward_mean: float
    reward_histogram_edges: _containers.RepeatedScalarFieldContainer[float]
    reward_histogram_counts: _containers.RepeatedScalarFieldContainer[int]
    per_version: _containers.RepeatedCompositeFieldContainer[VersionCount]
    latest_version: int
    adds_per_s: float
    samples_per_s: float
    searchers: _containers.RepeatedCompositeFieldContainer[SearcherInfo]
    trajectories_added_total: int
    groups_sampled_total: int
    evicted_total: int
    run: Run
    def __init__(self, trajectories: _Optional[int] = ..., prompts: _Optional[int] = ..., prompts_with_trajectories: _Optional[int] = ..., leases_in_flight: _Optional[int] = ..., reward_mean: _Optional[float] = ..., reward_histogram_edges: _Optional[_Iterable[float]] = ..., reward_histogram_counts: _Optional[_Iterable[int]] = ..., per_version: _Optional[_Iterable[_Union[VersionCount, _Mapping]]] = ..., latest_version: _Optional[int] = ..., adds_per_s: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., searchers: _Optional[_Iterable[_Union[SearcherInfo, _Mapping]]] = ..., trajectories_added_total: _Optional[int] = ..., groups_sampled_total: _Optional[int] = ..., evicted_total: _Optional[int] = ..., run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class WeightVersion(_message.Message):
    __slots__ = ("version", "uri", "sha256", "step", "published_at_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    uri: str
    sha256: str
    step: int
    published_at_s: float
    def __init__(self, version: _Optional[int] = ..., uri: _Optional[str] = ..., sha256: _Optional[str] = ..., step: _Optional[int] = ..., published_at_s: _Optional[float] = ...) -> None: ...

class AnnounceWeightsRequest(_message.Message):
    __slots__ = ("weights",)
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    weights: WeightVersion
    def __init__(self, weights: _Optional[_Union[WeightVersion, _Mapping]] = ...) -> None: ...

class AnnounceWeightsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLatestWeightsRequest(_message.Message):
    __slots__ = ("newer_than", "wait_s")
    NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    newer_than: int
    wait_s: float
    def __init__(self, newer_than: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class GetLatestWeightsResponse(_message.Message):
    __slots__ = ("available", "weights", "waited_s")
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    available: bool
    weights: WeightVersion
    waited_s: float
    def __init__(self, available: _Optional[bool] = ..., weights: _Optional[_Union[WeightVersion, _Mapping]] = ..., waited_s: _Optional[float] = ...) -> None: ...

class RunIdentity(_message.Message):
    __slots__ = ("model_source", "model_revision", "tokenizer_sha256", "task_name", "prompt_template_sha256", "temperature", "max_new_tokens", "temperature_low", "temperature_high", "temperature_draw_fraction")
    MODEL_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_REVISION_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SHA256_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEMPLATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_LOW_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_HIGH_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_DRAW_FRACTION_FIELD_NUMBER: _ClassVar[int]
    model_source: str
    model_revision: str
    tokenizer_sha256: str
    task_name: str
    prompt_template_sha256: str
    temperature: float
    max_new_tokens: int
    temperature_low: float
    temperature_high: float
    temperature_draw_fraction: float
    def __init__(self, model_source: _Optional[str] = ..., model_revision: _Optional[str] = ..., tokenizer_sha256: _Optional[str] = ..., task_name: _Optional[str] = ..., prompt_template_sha256: _Optional[str] = ..., temperature: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., temperature_low: _Optional[float] = ..., temperature_high: _Optional[float] = ..., temperature_draw_fraction: _Optional[float] = ...) -> None: ...

class RunRecipe(_message.Message):
    __slots__ = ("task_json", "model_json", "model_seed")
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    MODEL_JSON_FIELD_NUMBER: _ClassVar[int]
    MODEL_SEED_FIELD_NUMBER: _ClassVar[int]
    task_json: str
    model_json: str
    model_seed: int
    def __init__(self, task_json: _Optional[str] = ..., model_json: _Optional[str] = ..., model_seed: _Optional[int] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "identity", "recipe", "registered_at_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    identity: RunIdentity
    recipe: RunRecipe
    registered_at_s: float
    def __init__(self, run_id: _Optional[str] = ..., identity: _Optional[_Union[RunIdentity, _Mapping]] = ..., recipe: _Optional[_Union[RunRecipe, _Mapping]] = ..., registered_at_s: _Optional[float] = ...) -> None: ...

class RegisterRunRequest(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class RegisterRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class JoinRunRequest(_message.Message):
    __slots__ = ("searcher_id", "identity")
    SEARCHER_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    searcher_id: str
    identity: RunIdentity
    def __init__(self, searcher_id: _Optional[str] = ..., identity: _Optional[_Union[RunIdentity, _Mapping]] = ...) -> None: ...

class JoinRunResponse(_message.Message):
    __slots__ = ("registered", "run")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    run: Run
    def __init__(self, registered: _Optional[bool] = ..., run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...
