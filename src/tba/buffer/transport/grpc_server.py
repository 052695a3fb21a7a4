"""The gRPC server of the buffer service: `tba.v1.ReplayBuffer` (grpc.aio), the standard
health service (readiness that follows the store, liveness) and reflection; optionally TLS
and a bearer token (`grpc_auth`). Servicer methods translate and delegate to BufferService;
domain errors become status codes through `grpc_status`, and a request that does not decode
becomes INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tba.buffer.config import BufferSettings
from tba.buffer.metrics import HandlingTimes
from tba.buffer.service import BufferService
from tba.buffer.transport import proto_convert
from tba.buffer.transport.grpc_auth import TokenInterceptor
from tba.buffer.transport.grpc_client import channel_options
from tba.buffer.transport.grpc_status import code_for
from tba.errors import TbaError
from tba.v1 import buffer_pb2 as pb
from tba.v1 import buffer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
R = TypeVar("R")
SERVICE = pb.DESCRIPTOR.services_by_name["ReplayBuffer"]
SERVICE_NAME = SERVICE.full_name
# The gRPC health service names probes ask: readiness (can the buffer serve calls: is its
# store reachable?) and liveness (is the process serving at all?; "" is the whole server).
READINESS = SERVICE_NAME
LIVENESS = ""


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What a request that is not a valid message of its type decodes to."""

    reason: str


def _tolerant_decoder(message_type: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """grpc answers a decoder's exception with UNKNOWN and a logged traceback; bad bytes from
    a client are its error, so they decode to `Undecodable` and the servicer refuses them."""

    def decode(data: bytes) -> Message | Undecodable:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Undecodable(str(exc))

    return decode


def _maps_errors(
    method: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        if isinstance(request, Undecodable):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}"
            )
        started_s = time.perf_counter()
        waited_s = 0.0
        try:
            response = await method(self, request, context)
            waited_s = _waited_s(response)
            return response
        except TbaError as exc:
            refused = exc
        finally:
            if self.handling is not None:
                handled_s = time.perf_counter() - started_s - waited_s
                self.handling.observe(method.__name__, handled_s)
        # abort raises (grpc ends the call with its status), so nothing follows it. It comes
        # after the call is recorded: a client that sees the status finds it on /metrics.
        await context.abort(code_for(refused), str(refused))

    return wrapper


def _waited_s(response: object) -> float:
    """A long poll's time before the read it answered with, which its handling time leaves
    out."""
    long_polls = (pb.SampleResponse, pb.GetLatestWeightsResponse)
    return response.waited_s if isinstance(response, long_polls) else 0.0


class ReplayBufferServicer(pb_grpc.ReplayBufferServicer):
    def __init__(self, service: BufferService, handling: HandlingTimes | None = None) -> None:
        self._service = service
        self.handling = handling

    @_maps_errors
    async def PutPrompts(self, request: Any, context: Any) -> pb.PutPromptsResponse:
        prompts = [proto_convert.prompt_from_pb(p) for p in request.prompts]
        result = await self._service.put_prompts(prompts)
        return pb.PutPromptsResponse(prompt_ids=result.prompt_ids, created=result.created)

    @_maps_errors
    async def LeasePrompts(self, request: Any, context: Any) -> pb.LeasePromptsResponse:
        lease = await self._service.lease_prompts(
            request.searcher_id, request.max_prompts, request.lease_s
        )
        return proto_convert.lease_to_pb(lease)

    @_maps_errors
    async def AddTrajectories(self, request: Any, context: Any) -> pb.AddTrajectoriesResponse:
        received = request.trajectories
        result = await self._service.add_received(
            max((t.policy_version for t in received), default=0),
            lambda: [proto_convert.trajectory_from_pb(t) for t in received],
            request_id=request.request_id,
            searcher_id=request.searcher_id,
            lease_id=request.lease_id,
            run_id=request.run_id,
        )
        return proto_convert.add_result_to_pb(result)

    @_maps_errors
    async def Sample(self, request: Any, context: Any) -> pb.SampleResponse:
        batch = await self._service.sample(proto_convert.sample_spec_from_pb(request))
        return proto_convert.batch_to_pb(batch)

    @_maps_errors
    async def GetStats(self, request: Any, context: Any) -> pb.Stats:
        return proto_convert.stats_to_pb(await self._service.stats())

    @_maps_errors
    async def AnnounceWeights(self, request: Any, context: Any) -> pb.AnnounceWeightsResponse:
        await self._service.announce_weights(proto_convert.weights_from_pb(request.weights))
        return pb.AnnounceWeightsResponse()

    @_maps_errors
    async def GetLatestWeights(self, request: Any, context: Any) -> pb.GetLatestWeightsResponse:
        latest, waited_s = await self._service.newer_weights(request.newer_than, request.wait_s)
        if latest is None:
            return pb.GetLatestWeightsResponse(available=False, waited_s=waited_s)
        return pb.GetLatestWeightsResponse(
            available=True, weights=proto_convert.weights_to_pb(latest), waited_s=waited_s
        )

    @_maps_errors
    async def RegisterRun(self, request: Any, context: Any) -> pb.RegisterRunResponse:
        run = await self._service.register_run(proto_convert.run_from_pb(request.run))
        return pb.RegisterRunResponse(run=proto_convert.run_to_pb(run))

    @_maps_errors
    async def JoinRun(self, request: Any, context: Any) -> pb.JoinRunResponse:
        identity = proto_convert.identity_from_pb(request.identity)
        run = await self._service.join_run(request.searcher_id, identity)
        if run is None:
            return pb.JoinRunResponse(registered=False)
        return pb.JoinRunResponse(registered=True, run=proto_convert.run_to_pb(run))


def _replay_buffer_handler(servicer: ReplayBufferServicer) -> grpc.GenericRpcHandler:
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_tolerant_decoder(getattr(pb, method.input_type.name)),
            response_serializer=lambda message: message.SerializeToString(),
        )
        for method in SERVICE.methods
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def _server_credentials(settings: BufferSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    pair = (settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())
    return grpc.ssl_server_credentials([pair])


class StoreReadiness:
    """Keeps the health of READINESS on the store: SERVING while it answers a read, checked
    every `interval_s`, NOT_SERVING while it does not. LIVENESS stays SERVING meanwhile: a
    store outage is no reason to restart the buffer, which reconnects by itself."""

    def __init__(
        self, service: BufferService, health: health_aio.HealthServicer, interval_s: float
    ) -> None:
        self._service = service
        self._health = health
        self._interval_s = interval_s
        self._serving: bool | None = None

    async def check(self) -> None:
        try:
            await self._service.check_store()
        except Exception as exc:  # whatever the store raises, it does not serve now
            await self._set(False, str(exc))
        else:
            await self._set(True, "")

    async def _set(self, serving: bool, problem: str) -> None:
        if serving == self._serving:
            return
        if not serving:
            log.warning("store unavailable, readiness NOT_SERVING: %s", problem)
        elif self._serving is not None:
            log.info("store reachable again, readiness SERVING")
        self._serving = serving
        statuses = health_pb2.HealthCheckResponse
        await self._health.set(READINESS, statuses.SERVING if serving else statuses.NOT_SERVING)

    async def follow(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.check()


@dataclass
class GrpcServer:
    server: grpc.aio.Server
    port: int
    health: health_aio.HealthServicer
    readiness: asyncio.Task[None]

    async def stop(self, grace_s: float) -> None:
        """Says NOT_SERVING to every probe, then lets calls in flight finish."""
        await self.health.enter_graceful_shutdown()
        self.readiness.cancel()
        await self.server.stop(grace_s)


async def start_grpc_server(
    service: BufferService, settings: BufferSettings, handling: HandlingTimes | None = None
) -> GrpcServer:
    """Starts serving (`port` is the bound one, useful when `grpc_port` is 0), with health
    and reflection; READINESS follows the store from its first check on; each call's
    handling time goes to `handling`."""
    token = settings.auth_token
    server = grpc.aio.server(
        options=channel_options(settings.max_message_bytes),
        interceptors=[TokenInterceptor(token)] if token is not None else [],
    )
    servicer = ReplayBufferServicer(service, handling)
    server.add_generic_rpc_handlers((_replay_buffer_handler(servicer),))
    health_servicer = health_aio.HealthServicer()  # LIVENESS starts SERVING
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = _add_port(server, settings)
    await server.start()
    readiness = StoreReadiness(service, health_servicer, settings.store_check_interval_s)
    await readiness.check()
    return GrpcServer(server, port, health_servicer, asyncio.create_task(readiness.follow()))


def _add_port(server: grpc.aio.Server, settings: BufferSettings) -> int:
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    credentials = _server_credentials(settings)
    if credentials is None:
        bound_port = server.add_insecure_port(address)
    else:
        bound_port = server.add_secure_port(address, credentials)
    if bound_port == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    return bound_port
