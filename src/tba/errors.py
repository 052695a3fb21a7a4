"""Domain errors. Transports map them to status codes in one place each
(`tba.buffer.transport.grpc_status` for gRPC, `tba.buffer.transport.rest` for HTTP)."""


class TbaError(Exception):
    """Base class of errors a caller can act on."""


class InvalidArgumentError(TbaError):
    """The request is malformed or out of bounds; nothing was changed."""


class NotFoundError(TbaError):
    """The request names something that does not exist; nothing was changed."""


class FailedPreconditionError(TbaError):
    """The request is well-formed but conflicts with current state (e.g. a stale version)."""


class ResourceExhaustedError(TbaError):
    """The request is larger than the service accepts."""


class UnauthenticatedError(TbaError):
    """The request carries no valid credentials for a service that requires them."""


class UnavailableError(TbaError):
    """A backing service (store, object store) cannot be reached right now; retry later."""
