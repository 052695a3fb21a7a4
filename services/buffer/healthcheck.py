"""Container health check of the buffer service: asks the standard gRPC health service whether
`tba.v1.ReplayBuffer` is SERVING, the buffer's readiness (NOT_SERVING while its store cannot
be reached). Exits 0 when it is, 1 otherwise.

Docker's HEALTHCHECK (and so docker-compose, whose trainer and searchers wait for it) has no
gRPC probe of its own; Kubernetes does, and uses that instead, with liveness apart. Usage:
`python healthcheck.py [HOST:PORT]`; the default address is 127.0.0.1 and the port in
TBA_BUFFER__GRPC_PORT (50051).
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "tba.v1.ReplayBuffer"
TIMEOUT_S = 3.0


def check(address: str) -> str | None:
    """None when the service is SERVING, else why not."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return f"{address}: {exc.code().name}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def main() -> int:
    default = f"127.0.0.1:{os.environ.get('TBA_BUFFER__GRPC_PORT', '50051')}"
    problem = check(sys.argv[1] if len(sys.argv) > 1 else default)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
