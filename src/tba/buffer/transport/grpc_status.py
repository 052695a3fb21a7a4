"""The one place domain errors become gRPC status codes, and back."""

from __future__ import annotations

import grpc

from tba import errors

_TO_CODE: dict[type[errors.TbaError], grpc.StatusCode] = {
    errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
    errors.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
}
_FROM_CODE = {code: cls for cls, code in _TO_CODE.items()}


def code_for(error: errors.TbaError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _TO_CODE:
            return _TO_CODE[cls]
    return grpc.StatusCode.INTERNAL


def error_from_rpc(error: grpc.RpcError) -> Exception:
    """A client-side RpcError as the domain error it stands for (or itself when none)."""
    code = error.code() if hasattr(error, "code") else None
    cls = _FROM_CODE.get(code)  # type: ignore[arg-type]
    if cls is None:
        return error
    return cls(error.details() if hasattr(error, "details") else str(error))
