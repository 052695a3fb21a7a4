"""Settings of the buffer service and of its clients, and the root settings of
`tba buffer serve` (`BufferServeSettings`)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, field_validator, model_validator

from tba.settings import CommandSettings, Section

MIB = 1024 * 1024
# Interval points one history holds at most: a day at one point every 0.2 s.
MAX_HISTORY_POINTS = 432_000


class BufferSettings(Section):
    """`[buffer]`: the replay-buffer service (`tba buffer serve`)."""

    store: str = Field(
        "memory",
        description="`memory` for the embedded in-process store, or `redis://HOST:PORT/DB`.",
    )
    key_prefix: str = Field(
        "tba", min_length=1, max_length=64, description="Prefix of every Redis key."
    )
    grpc_host: str = Field("127.0.0.1", description="Address the gRPC server binds.")
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    http_host: str = Field("127.0.0.1", description="Address the REST server binds.")
    http_port: int = Field(8080, ge=0, le=65535, description="REST port; 0 picks a free one.")
    capacity: int = Field(
        1_000_000, ge=1, description="Trajectories kept in all; the oldest are evicted beyond."
    )
    freeze_growth_after_step: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Once the trainer reports this step (its step metrics ride on each "
        "Sample call), the buffer stops growing: it holds at most the trajectories it held "
        "then, each new one still accepted and the oldest evicted, as beyond `capacity`. "
        "Kept across restarts with Redis. 0 never. Paper, red-teaming: 4,000.",
    )
    prompt_history: int = Field(
        100, ge=1, le=10_000, description="Trajectories kept per prompt; the oldest go first."
    )
    dedup: bool = Field(
        True,
        description="A completion identical to one stored for the same prompt replaces it "
        "instead of adding a copy.",
    )
    recency_window: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Recency sampling draws among this many prompts: those whose newest "
        "completions come from the newest policy versions (among equals, the most recently "
        "added).",
    )
    lease_s: float = Field(
        120.0, gt=0, le=86_400, description="Default lease on prompts taken by a searcher."
    )
    max_lease_prompts: int = Field(
        1024, ge=1, description="Most prompts one LeasePrompts call may take."
    )
    request_id_ttl_s: float = Field(
        3600.0, gt=0, description="How long AddTrajectories remembers a request id for retries."
    )
    max_message_bytes: int = Field(
        64 * MIB, ge=MIB, le=2047 * MIB, description="Largest gRPC message either way."
    )
    max_completion_tokens: int = Field(
        65_536, ge=1, description="Longest completion (tokens) a trajectory may carry."
    )
    max_text_chars: int = Field(
        1_000_000, ge=1, description="Longest prompt or completion text accepted."
    )
    max_batch_trajectories: int = Field(
        8192, ge=1, description="Most trajectories one AddTrajectories call may carry."
    )
    adds_in_flight: int = Field(
        2,
        ge=1,
        le=1024,
        description="AddTrajectories calls the service works on at once; the others wait "
        "their turn. Ingest is CPU work in one event loop and scripts in Redis: a cap keeps a "
        "burst of posts from many searchers from queueing ahead of each step of the trainer's "
        "Sample (2 overlaps one call's Redis round trips with another's CPU; 1 serialises "
        "them and ingests less when several searchers post at once).",
    )
    add_chunk_size: int = Field(
        32,
        ge=0,
        le=65_536,
        description="Most trajectories one store write takes: a larger AddTrajectories "
        "call is stored in chunks this size, one after another, each after the Sample draws "
        "running when it is ready, so a draw's round trips to Redis wait behind at most "
        "`adds_in_flight` chunks, not whole batches (a batch's lease is acknowledged with its "
        "last chunk; a retry stores only the chunks not stored yet). 0: one write a call.",
    )
    adds_fresh_first_max_wait_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="While AddTrajectories calls wait for one of the `adds_in_flight` "
        "slots, the one with the newest policy version goes next (when ingest runs short, "
        "the completions the trainer waits for would otherwise queue behind older ones); one "
        "that has waited this long goes before any, so none starves. 0: in order of arrival.",
    )
    max_prompts_per_call: int = Field(
        100_000, ge=1, description="Most prompts one PutPrompts call may carry."
    )
    max_sample_groups: int = Field(4096, ge=1, description="Largest B one Sample call may ask.")
    max_sample_wait_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="Longest a Sample call may ask to wait for data (its `wait_s`, a long "
        "poll); longer asks are refused. Keep it below the clients' call deadline.",
    )
    sample_recheck_s: float = Field(
        0.25,
        gt=0,
        le=60,
        description="A waiting Sample draws again, and a waiting GetLatestWeights reads the "
        "latest version again, at least this often. Adds and announcements served by this "
        "process wake them at once; those served by another process on the same store do not.",
    )
    max_weights_wait_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="Longest a GetLatestWeights call may ask to wait for a newer version (its "
        "`wait_s`, a long poll); longer asks are refused. Keep it below the clients' call "
        "deadline.",
    )
    max_samples_per_prompt: int = Field(
        1024, ge=1, description="Largest K one Sample call may ask."
    )
    reward_histogram_edges: list[float] = Field(
        default_factory=lambda: [i / 10 for i in range(-10, 11)],
        min_length=2,
        description="Bin edges of the reward histogram in stats (sorted, at least two).",
    )
    rate_window_s: float = Field(
        30.0, gt=0, description="Window over which adds/s and samples/s are measured."
    )
    history_interval_s: float = Field(
        5.0,
        ge=0.1,
        le=3600,
        description="How often the buffer appends a point to its history (GET /v1/history, "
        "the dashboard's curves): its state and the trainer's latest step metrics.",
    )
    history_span_s: float = Field(
        86_400.0,
        ge=1,
        le=30 * 86_400,
        description="How far back the history reaches; older points are forgotten (at most "
        "2 x span / interval points are kept, in the store: Redis keeps them across restarts).",
    )
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Time a REST client has to send a request line and headers, counted "
        "from the connection or from the previous response; then the connection is closed.",
    )
    http_body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Time a REST client has to send a whole request body once its headers "
        "are in (then 408 and the connection is closed), and the longest the rest of a "
        "refused body is read and discarded.",
    )
    http_max_connections: int = Field(
        512,
        ge=1,
        le=100_000,
        description="Most REST connections served at once; a request on one more gets 503 "
        "and its connection is closed.",
    )
    store_check_interval_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often the service checks that the store answers; gRPC health of "
        "`tba.v1.ReplayBuffer` (readiness) says NOT_SERVING while it does not.",
    )
    auth_token: SecretStr | None = Field(
        None,
        min_length=16,
        description="Shared token every gRPC call and REST write must carry "
        "(`authorization: Bearer TOKEN`); health, metrics and reads stay open. Unset: no "
        "check (a warning at start). Clients set the same value as `client.auth_token`.",
    )
    tls_cert_file: Path | None = Field(
        None, description="PEM certificate (chain) of the gRPC server; set with tls_key_file."
    )
    tls_key_file: Path | None = Field(
        None, description="PEM private key of tls_cert_file. Both unset: plaintext gRPC."
    )

    @field_validator("store")
    @classmethod
    def _check_store(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("store must be `memory` or a redis:// URL")
        return value

    @field_validator("reward_histogram_edges")
    @classmethod
    def _check_edges(cls, value: list[float]) -> list[float]:
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("reward_histogram_edges must be strictly increasing")
        return value

    @model_validator(mode="after")
    def _check_history_points(self) -> Self:
        if self.history_span_s / self.history_interval_s > MAX_HISTORY_POINTS:
            raise ValueError(
                f"history_span_s / history_interval_s must be at most {MAX_HISTORY_POINTS} "
                "points: lengthen the interval or shorten the span"
            )
        return self

    @model_validator(mode="after")
    def _check_tls_pair(self) -> Self:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file are set together or not at all")
        return self


class BufferClientSettings(Section):
    """`[client]`: how trainers and searchers reach the buffer service."""

    address: str = Field("127.0.0.1:50051", description="host:port of the buffer's gRPC server.")
    timeout_s: float = Field(30.0, gt=0, le=3600, description="Deadline of one call.")
    max_message_bytes: int = Field(
        64 * MIB, ge=MIB, le=2047 * MIB, description="Largest gRPC message either way."
    )
    retries: int = Field(
        8, ge=0, le=1000, description="Retries of an unavailable service, with backoff."
    )
    retry_backoff_s: float = Field(
        0.5, gt=0, le=60, description="First backoff; doubles each retry up to 10 s."
    )
    auth_token: SecretStr | None = Field(
        None, min_length=16, description="The buffer's `buffer.auth_token`, sent on every call."
    )
    tls_ca_file: Path | None = Field(
        None,
        description="PEM certificate(s) that sign the buffer's TLS certificate; set: the "
        "client speaks TLS and checks the server against them. Unset: plaintext gRPC.",
    )


class BufferServeSettings(CommandSettings):
    buffer: BufferSettings = BufferSettings()
