"""Token check of the gRPC server: every call must carry `authorization: Bearer TOKEN`, except
the standard health and reflection services, which probes and tools use without secrets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from pydantic import SecretStr

from tba.buffer.access import AUTHORIZATION, bearer_authorizes

OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
DENIED = "missing or wrong bearer token in the `authorization` metadata"


async def _deny(request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


_DENY_HANDLER = grpc.unary_unary_rpc_method_handler(_deny)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Aborts calls without the token with UNAUTHENTICATED before they are decoded."""

    def __init__(self, token: SecretStr) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        metadata = handler_call_details.invocation_metadata or ()
        presented = next((v for k, v in metadata if k == AUTHORIZATION), None)
        if isinstance(presented, bytes) or not bearer_authorizes(presented, self._token):
            return _DENY_HANDLER
        return await continuation(handler_call_details)
