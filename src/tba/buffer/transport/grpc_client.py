"""Synchronous client of the buffer service, used by trainers, searchers and tools.

Calls that fail with UNAVAILABLE (service restarting, Redis reconnecting) are retried with
exponential backoff; AddTrajectories retries reuse the request id, so nothing is stored twice.
With `auth_token` set every call carries it as `authorization: Bearer` metadata; with
`tls_ca_file` set the channel is TLS, checked against those certificates.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

from tba import domain, runs
from tba.buffer.access import AUTHORIZATION, bearer_header
from tba.buffer.config import BufferClientSettings
from tba.buffer.transport import proto_convert
from tba.buffer.transport.grpc_status import error_from_rpc
from tba.retry import Backoff, retry
from tba.v1 import buffer_pb2 as pb
from tba.v1 import buffer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_MAX_BACKOFF_S = 10.0


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def open_channel(settings: BufferClientSettings) -> grpc.Channel:
    """A channel to the buffer: TLS when `tls_ca_file` is set, else plaintext."""
    options = channel_options(settings.max_message_bytes)
    if settings.tls_ca_file is None:
        return grpc.insecure_channel(settings.address, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=settings.tls_ca_file.read_bytes())
    return grpc.secure_channel(settings.address, credentials, options=options)


class BufferClient:
    def __init__(self, settings: BufferClientSettings | None = None) -> None:
        self.settings = settings or BufferClientSettings()
        self._channel = open_channel(self.settings)
        self._stub = pb_grpc.ReplayBufferStub(self._channel)
        token = self.settings.auth_token
        self._metadata = ((AUTHORIZATION, bearer_header(token)),) if token is not None else ()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> BufferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Blocks until the service answers, or raises UnavailableError."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError as exc:
            from tba.errors import UnavailableError

            raise UnavailableError(
                f"buffer service at {self.settings.address} not reachable in {timeout_s} s"
            ) from exc

    def put_prompts(self, prompts: Sequence[domain.Prompt]) -> domain.PutPromptsResult:
        request = pb.PutPromptsRequest(prompts=[proto_convert.prompt_to_pb(p) for p in prompts])
        response = self._call(self._stub.PutPrompts, request)
        return domain.PutPromptsResult(list(response.prompt_ids), response.created)

    def lease_prompts(
        self, searcher_id: str, max_prompts: int, lease_s: float = 0.0
    ) -> domain.Lease:
        request = pb.LeasePromptsRequest(
            searcher_id=searcher_id, max_prompts=max_prompts, lease_s=lease_s
        )
        return proto_convert.lease_from_pb(self._call(self._stub.LeasePrompts, request))

    def add_trajectories(
        self,
        trajectories: Sequence[domain.Trajectory],
        *,
        searcher_id: str,
        request_id: str,
        lease_id: str = "",
        run_id: str = "",
    ) -> domain.AddResult:
        """`request_id`: the caller's (`domain.new_request_id`), new for each batch and the
        same for its retries; this client's own retries of the call reuse it."""
        request = pb.AddTrajectoriesRequest(
            request_id=request_id,
            searcher_id=searcher_id,
            lease_id=lease_id,
            trajectories=[proto_convert.trajectory_to_pb(t) for t in trajectories],
            run_id=run_id,
        )
        return proto_convert.add_result_from_pb(self._call(self._stub.AddTrajectories, request))

    def sample(self, spec: domain.SampleSpec) -> domain.Batch:
        """A draw; with `spec.wait_s`, the call's deadline is that much longer (a long poll)."""
        request = proto_convert.sample_spec_to_pb(spec)
        response = self._call(self._stub.Sample, request, waits_s=spec.wait_s)
        return proto_convert.batch_from_pb(response)

    def stats(self) -> domain.BufferStats:
        return proto_convert.stats_from_pb(self._call(self._stub.GetStats, pb.GetStatsRequest()))

    def announce_weights(self, weights: domain.WeightVersion) -> None:
        request = pb.AnnounceWeightsRequest(weights=proto_convert.weights_to_pb(weights))
        self._call(self._stub.AnnounceWeights, request)

    def latest_weights(
        self, newer_than: int = 0, wait_s: float = 0.0
    ) -> domain.WeightVersion | None:
        """The latest announced version (None before the first); with `wait_s`, a long poll:
        the buffer answers once a version newer than `newer_than` is announced, or after
        `wait_s` (a buffer older than the long poll answers at once), and the call's deadline
        is that much longer."""
        request = pb.GetLatestWeightsRequest(newer_than=newer_than, wait_s=wait_s)
        response = self._call(self._stub.GetLatestWeights, request, waits_s=wait_s)
        return proto_convert.weights_from_pb(response.weights) if response.available else None

    def register_run(self, run: runs.Run) -> runs.Run:
        request = pb.RegisterRunRequest(run=proto_convert.run_to_pb(run))
        return proto_convert.run_from_pb(self._call(self._stub.RegisterRun, request).run)

    def join_run(self, searcher_id: str, identity: runs.RunIdentity) -> runs.Run | None:
        """The registered run (None while there is none); FailedPreconditionError when
        `identity` contradicts it."""
        request = pb.JoinRunRequest(
            searcher_id=searcher_id, identity=proto_convert.identity_to_pb(identity)
        )
        response = self._call(self._stub.JoinRun, request)
        return proto_convert.run_from_pb(response.run) if response.registered else None

    def _call(self, method: Callable[..., T], request: object, waits_s: float = 0.0) -> T:
        """`method(request)`, retried while the service is unavailable; its final error as
        the domain error of its status code. `waits_s`: how long the service may hold the
        call on purpose, beyond the usual deadline."""
        # A bad wait (negative, NaN, inf) adds nothing: the service refuses it by name.
        timeout_s = self.settings.timeout_s + (waits_s if 0 < waits_s < math.inf else 0.0)
        backoff = Backoff(
            retries=self.settings.retries,
            first_s=self.settings.retry_backoff_s,
            max_s=_MAX_BACKOFF_S,
        )
        try:
            return retry(
                lambda: method(request, timeout=timeout_s, metadata=self._metadata),
                backoff,
                retry_on=_retryable,
                on_retry=_log_retry,
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc


def _retryable(exc: Exception) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() in _RETRYABLE


def _log_retry(exc: Exception, number: int, wait_s: float) -> None:
    code = exc.code() if isinstance(exc, grpc.RpcError) else exc
    log.warning("buffer call failed (%s), retry %d in %.1f s", code, number, wait_s)
