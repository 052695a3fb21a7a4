"""REST API of the buffer service for people (FastAPI): submit prompts, inspect stats and
weight versions, health, Prometheus metrics, OpenAPI docs at /docs. The only HTTP module.
Handlers translate and delegate to BufferService; domain errors become statuses here.
With a token set, every write needs `Authorization: Bearer TOKEN`; reads stay open."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tba import errors
from tba.buffer import metrics
from tba.buffer.access import bearer_authorizes
from tba.buffer.service import BufferService
from tba.domain import BufferStats, Prompt

_STATUS: dict[type[errors.TbaError], int] = {
    errors.InvalidArgumentError: 422,
    errors.NotFoundError: 404,
    errors.FailedPreconditionError: 409,
    errors.ResourceExhaustedError: 413,
    errors.UnavailableError: 503,
    errors.UnauthenticatedError: 401,
}
# How a client answers a 401 (RFC 6750).
_CHALLENGE = {401: {"WWW-Authenticate": "Bearer"}}


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: error replies echo what a client sent, and
    JSON input can hold lone surrogates, which UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


class ErrorOut(BaseModel):
    detail: str | list[dict[str, Any]] = Field(
        description="What was wrong: a message, or the list of schema validation errors."
    )


_ERROR_MEANING = {
    400: "The body is not JSON.",
    401: "No bearer token, or not the buffer's.",
    413: "The body or a field is larger than the buffer accepts.",
    422: "The request breaks the schema or the buffer's rules; nothing was changed.",
    503: "The store cannot be reached; retry later.",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of the error statuses a route answers with."""
    return {s: {"model": ErrorOut, "description": _ERROR_MEANING[s]} for s in statuses}


class PromptIn(BaseModel):
    text: str = Field(min_length=1, description="The prompt as the task formats it.")
    answer: str = Field("", description="Gold answer the task's reward compares against.")
    id: str = Field("", max_length=128, description="Optional id; existing ids are kept.")


class PutPromptsIn(BaseModel):
    prompts: list[PromptIn] = Field(min_length=1)


class PutPromptsOut(BaseModel):
    prompt_ids: list[str]
    created: int


class WeightsOut(BaseModel):
    available: bool
    version: int = 0
    uri: str = ""
    sha256: str = ""
    step: int = 0
    published_at_s: float = 0.0


class StatsOut(BaseModel):
    trajectories: int
    prompts: int
    prompts_with_trajectories: int
    leases_in_flight: int
    reward_mean: float
    reward_histogram: dict[str, Any]
    per_version: dict[str, int]
    staleness: dict[str, int] = Field(description="Trajectories per versions behind latest.")
    latest_version: int
    adds_per_s: float
    samples_per_s: float
    searchers: list[dict[str, Any]]
    trajectories_added_total: int
    groups_sampled_total: int
    evicted_total: int


def stats_out(s: BufferStats) -> StatsOut:
    return StatsOut(
        trajectories=s.trajectories,
        prompts=s.prompts,
        prompts_with_trajectories=s.prompts_with_trajectories,
        leases_in_flight=s.leases_in_flight,
        reward_mean=s.reward_mean,
        reward_histogram={"edges": s.reward_histogram_edges, "counts": s.reward_histogram_counts},
        per_version={str(v): n for v, n in sorted(s.per_version.items())},
        staleness={str(a): n for a, n in s.staleness().items()},
        latest_version=s.latest_version,
        adds_per_s=s.adds_per_s,
        samples_per_s=s.samples_per_s,
        searchers=[dataclasses.asdict(x) for x in s.searchers],
        trajectories_added_total=s.trajectories_added_total,
        groups_sampled_total=s.groups_sampled_total,
        evicted_total=s.evicted_total,
    )


class BodyLimit:
    """Refuses request bodies over `max_bytes` with 413 before the app reads them."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and int(declared) > self.max_bytes:
            await _too_large(self.max_bytes)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise errors.ResourceExhaustedError(f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, counting_receive, send)


def _too_large(max_bytes: int) -> JSONResponse:
    return JSONResponse({"detail": f"request body over {max_bytes} bytes"}, status_code=413)


def writer_check(token: SecretStr | None) -> Any:
    """The dependency of every write route: refuses a request without `token`."""
    bearer = HTTPBearer(auto_error=False, description="The buffer's auth_token.")

    async def require_token(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
    ) -> None:
        if token is None:
            return
        header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
        if not bearer_authorizes(header, token):
            raise errors.UnauthenticatedError(
                "writes need `Authorization: Bearer TOKEN` with the buffer's auth_token"
            )

    return Depends(require_token)


def create_app(
    service: BufferService, max_body_bytes: int, auth_token: SecretStr | None = None
) -> FastAPI:
    app = FastAPI(
        title="TBA replay buffer",
        version="1",
        description="Submit prompts, inspect the replay buffer and the weight versions.",
    )
    writer = [writer_check(auth_token)]

    @app.exception_handler(errors.TbaError)
    async def _domain_error(request: Request, exc: errors.TbaError) -> JSONResponse:
        status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 500)
        headers = _CHALLENGE.get(status)
        return AsciiJSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _schema_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return AsciiJSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)

    @app.post(
        "/v1/prompts",
        response_model=PutPromptsOut,
        dependencies=writer,
        responses=_errors(400, 401, 413, 422, 503),
    )
    async def put_prompts(body: PutPromptsIn) -> PutPromptsOut:
        prompts = [Prompt(id=p.id, text=p.text, answer=p.answer) for p in body.prompts]
        result = await service.put_prompts(prompts)
        return PutPromptsOut(prompt_ids=result.prompt_ids, created=result.created)

    @app.get("/v1/stats", response_model=StatsOut, responses=_errors(503))
    async def get_stats() -> StatsOut:
        return stats_out(await service.stats())

    @app.get("/v1/weights", response_model=WeightsOut, responses=_errors(503))
    async def get_weights() -> WeightsOut:
        latest = await service.latest_weights()
        if latest is None:
            return WeightsOut(available=False)
        return WeightsOut(available=True, **dataclasses.asdict(latest))

    dashboard = resources.files("tba.buffer").joinpath("static/dashboard.html").read_text()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def get_dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard)

    @app.get("/healthz", responses=_errors(503))
    async def healthz() -> dict[str, str]:
        await service.latest_weights()  # reaches the store: unhealthy when it is down
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse, responses=_errors(503))
    async def get_metrics() -> Response:
        return Response(metrics.render(await service.stats()), media_type=metrics.CONTENT_TYPE)

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app
