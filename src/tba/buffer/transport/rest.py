"""REST API of the buffer service for people (FastAPI): submit prompts, inspect stats, the
history (`rest_history`) and weight versions, health, Prometheus metrics, OpenAPI docs at
/docs. Handlers translate and delegate to BufferService; domain errors become statuses here.
With a token set, every write needs `Authorization: Bearer TOKEN`; reads stay open.
`http_guard` stands in front: it checks the token before a body is read and bounds the
body's size and time."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Coroutine
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field

from tba import errors
from tba.buffer import metrics
from tba.buffer.access import bearer_authorizes
from tba.buffer.config import BufferSettings
from tba.buffer.service import BufferService
from tba.buffer.transport.http_guard import RequestGuard
from tba.buffer.transport.rest_history import add_history_routes
from tba.buffer.validation import MAX_ID_CHARS
from tba.domain import BufferStats, Prompt
from tba.runs import Run

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
# The id rule of `validation.check_id` as far as a JSON Schema pattern (no Unicode classes)
# can say it: no whitespace, no C0 or C1 control character.
ID_PATTERN = r"^[^\s\x00-\x1f\x7f-\x9f]*$"


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: error replies echo what a client sent, and
    JSON input can hold lone surrogates, which UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def error_response(exc: errors.TbaError) -> JSONResponse:
    """The one mapping of domain errors to HTTP statuses and bodies."""
    status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 500)
    headers = _CHALLENGE.get(status)
    return AsciiJSONResponse({"detail": str(exc)}, status_code=status, headers=headers)


class _NonFinite(Exception):
    """A number JSON cannot carry, met while parsing."""


def _finite_number(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NonFinite(literal)
    return value


def _no_constant(literal: str) -> Any:
    raise _NonFinite(literal)


def finite_json(body: bytes) -> Any:
    """`body` parsed as RFC 8259 JSON: the json module also takes NaN, Infinity, -Infinity and
    numbers beyond a double (as inf), which no field here can hold and no reply can echo."""
    try:
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite_number)
    except _NonFinite as exc:
        message = f"{exc} is not a finite number; JSON numbers must be finite"
        raise json.JSONDecodeError(message, body.decode("utf-8", "replace"), 0) from exc


class FiniteJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = finite_json(await self.body())
        return self._json


class FiniteJSONRoute(APIRoute):
    """Routes whose JSON bodies are parsed by `finite_json`: FastAPI answers its
    JSONDecodeError with 422 and the message."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def finite_json_handler(request: Request) -> Response:
            return await handler(FiniteJSONRequest(request.scope, request.receive))

        return finite_json_handler


class ErrorOut(BaseModel):
    detail: str | list[dict[str, Any]] = Field(
        description="What was wrong: a message, or the list of schema validation errors."
    )


_ERROR_MEANING = {
    400: "The body is not JSON.",
    401: "No bearer token, or not the buffer's.",
    408: "The body did not arrive within the buffer's http_body_timeout_s.",
    413: "The body or a field is larger than the buffer accepts.",
    422: "The request breaks the schema or the buffer's rules; nothing was changed.",
    503: "The store cannot be reached; retry later.",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of the error statuses a route answers with."""
    return {s: {"model": ErrorOut, "description": _ERROR_MEANING[s]} for s in statuses}


class PromptIn(BaseModel):
    # The patterns only state in the schema what the service checks, with its own messages.
    text: str = Field(
        min_length=1,
        json_schema_extra={"pattern": r"\S"},
        description="The prompt as the task formats it; not only whitespace.",
    )
    answer: str = Field("", description="Gold answer the task's reward compares against.")
    id: str = Field(
        "",
        max_length=MAX_ID_CHARS,
        json_schema_extra={"pattern": ID_PATTERN},
        description="Optional id, without spaces or control characters (Unicode categories "
        "Z and C); existing ids are kept.",
    )


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


class RunIdentityOut(BaseModel):
    model_source: str = Field(description="A hub name, `tiny`, or `local` for a directory.")
    model_revision: str = Field(description="The hub commit, or `sha256:` of the weights.")
    tokenizer_sha256: str
    task_name: str
    prompt_template_sha256: str
    temperature: float = Field(description="The sampling temperature of the run.")
    max_new_tokens: int
    temperature_low: float = Field(0.0, description="The per-round range's low end; 0: none.")
    temperature_high: float = Field(0.0, description="The per-round range's high end; 0: none.")
    temperature_draw_fraction: float = Field(
        0.0, description="The fraction of rounds drawing from the range; 0: no range."
    )


class RunOut(BaseModel):
    """The registered run: what every searcher and the trainer agree on (docs/runs.md)."""

    run_id: str
    identity: RunIdentityOut
    task: dict[str, Any] = Field(description="The run's [task] section.")
    model: dict[str, Any] = Field(description="The run's [model] section.")
    registered_at_s: float


def run_out(run: Run) -> RunOut:
    return RunOut(
        run_id=run.run_id,
        identity=RunIdentityOut(**dataclasses.asdict(run.identity)),
        task=json.loads(run.recipe.task_json),
        model=json.loads(run.recipe.model_json),
        registered_at_s=run.registered_at_s,
    )


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
    run: RunOut | None = Field(description="The registered run; null while there is none.")


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
        run=run_out(s.run) if s.run is not None else None,
    )


def _configured_schema(app: FastAPI, settings: BufferSettings) -> Callable[[], dict[str, Any]]:
    """`app.openapi` with this server's limits on prompts, which the models cannot know."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        models = schema["components"]["schemas"]
        models["PutPromptsIn"]["properties"]["prompts"]["maxItems"] = settings.max_prompts_per_call
        for field in ("text", "answer"):
            models["PromptIn"]["properties"][field]["maxLength"] = settings.max_text_chars
        return schema

    return openapi


def create_app(service: BufferService, handling: metrics.HandlingTimes | None = None) -> FastAPI:
    """The REST app, behind its RequestGuard, with the service's settings (token, limits);
    /metrics shows the gRPC calls' `handling` times where given."""
    settings = service.settings
    app = FastAPI(
        title="TBA replay buffer",
        version="1",
        description="Submit prompts, inspect the replay buffer and the weight versions.",
    )
    app.router.route_class = FiniteJSONRoute
    _add_error_handlers(app)
    _add_write_routes(app, service)
    _add_read_routes(app, service, handling)
    _add_health_routes(app, service)
    app.openapi = _configured_schema(app, settings)  # type: ignore[method-assign]
    token = settings.auth_token
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_message_bytes,
        body_timeout_s=settings.http_body_timeout_s,
        authorizes=None if token is None else lambda header: bearer_authorizes(header, token),
        refuse=error_response,
    )
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(errors.TbaError)
    async def _domain_error(request: Request, exc: errors.TbaError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _schema_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return AsciiJSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)


def _add_write_routes(app: FastAPI, service: BufferService) -> None:
    guarded = service.settings.auth_token is not None
    # Declares the bearer scheme in OpenAPI when there is a token; RequestGuard checks it,
    # before the body is read, which a FastAPI dependency cannot do.
    bearer = HTTPBearer(auto_error=False, description="The buffer's auth_token.")

    write_dependencies = [bearer] if guarded else []
    write_errors = (400, *([401] if guarded else []), 408, 413, 422, 503)

    @app.post(
        "/v1/prompts",
        response_model=PutPromptsOut,
        dependencies=[Depends(d) for d in write_dependencies],
        responses=_errors(*write_errors),
    )
    async def put_prompts(body: PutPromptsIn) -> PutPromptsOut:
        prompts = [Prompt(id=p.id, text=p.text, answer=p.answer) for p in body.prompts]
        result = await service.put_prompts(prompts)
        return PutPromptsOut(prompt_ids=result.prompt_ids, created=result.created)

    add_history_routes(
        app,
        service,
        write_dependencies=write_dependencies,
        errors=_errors,
        write_errors=write_errors,
    )


def _add_read_routes(
    app: FastAPI, service: BufferService, handling: metrics.HandlingTimes | None
) -> None:
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

    @app.get("/metrics", response_class=PlainTextResponse, responses=_errors(503))
    async def get_metrics() -> Response:
        text = metrics.render(await service.stats(), handling)
        return Response(text, media_type=metrics.CONTENT_TYPE)


def _add_health_routes(app: FastAPI, service: BufferService) -> None:
    @app.get("/healthz", responses=_errors(503))
    async def healthz() -> dict[str, str]:
        """Readiness: 503 while the store cannot be reached."""
        await service.check_store()
        return {"status": "ok"}

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        """Liveness: the process serves, whatever the state of the store."""
        return {"status": "ok"}
