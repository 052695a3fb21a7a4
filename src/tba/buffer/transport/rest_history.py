"""The REST routes of the buffer's history (`tba.buffer.history`): `GET /v1/history` for the
dashboard's curves, `POST /v1/evaluations` for held-out metrics of a weight version."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI, Query
from pydantic import BaseModel, ConfigDict, Field

from tba.buffer.history import Evaluation, HistoryPoint
from tba.buffer.service import BufferService
from tba.buffer.validation import MAX_EVALUATION_METRICS, MAX_ID_CHARS


class BufferPointOut(BaseModel):
    reward_mean: float = Field(description="Mean reward of the stored trajectories.")
    adds_per_s: float = Field(description="Trajectories added per second (rate window).")
    samples_per_s: float = Field(description="Prompt groups sampled per second.")
    staleness_mean: float = Field(description="Mean versions behind the latest, stored.")
    staleness_max: int = Field(description="Most versions behind the latest, stored.")
    prompts: int
    trajectories: int
    active_searchers: int = Field(description="Searchers seen within the lease time.")
    latest_version: int


class TrainerReportOut(BaseModel):
    step: int
    loss: float
    kl: float
    log_z: float = Field(description="TB's log Z (the objective's baseline mean).")
    lr: float
    grad_norm: float
    step_time_s: float
    wait_data_s: float = Field(description="Time of the step spent waiting for a batch.")


class EvaluationIn(BaseModel):
    # Strict: the JSON types the schema states, so `false` is no metric value and `true` no
    # version (lax validation would read them as 0.0 and 1).
    model_config = ConfigDict(strict=True)

    version: int = Field(ge=0, description="The weight version evaluated (0: the base model).")
    step: int = Field(0, ge=0, description="The trainer step that published it.")
    metrics: dict[str, float] = Field(
        min_length=1,
        max_length=MAX_EVALUATION_METRICS,
        description=f"Held-out metrics by name (at most {MAX_ID_CHARS} characters each), "
        'e.g. {"accuracy": 0.42}.',
    )


class HistoryPointOut(BaseModel):
    """An interval point carries `buffer` (and `trainer` when the trainer reported since the
    previous point); an evaluation point carries `evaluation` only."""

    at_s: float = Field(description="Unix time of the point.")
    buffer: BufferPointOut | None = None
    trainer: TrainerReportOut | None = None
    evaluation: EvaluationIn | None = None


class HistoryOut(BaseModel):
    now_s: float = Field(description="The buffer's clock: ask `since` this next time.")
    interval_s: float = Field(description="Seconds between interval points.")
    span_s: float = Field(description="How far back the history reaches.")
    points: list[HistoryPointOut] = Field(description="Oldest first.")


def point_out(point: HistoryPoint) -> HistoryPointOut:
    return HistoryPointOut.model_validate(dataclasses.asdict(point))


def add_history_routes(
    app: FastAPI,
    service: BufferService,
    *,
    write_dependencies: list[Any],
    errors: Callable[..., dict[int | str, dict[str, Any]]],
    write_errors: tuple[int, ...],
) -> None:
    @app.get("/v1/history", response_model=HistoryOut, responses=errors(422, 503))
    async def get_history(
        since: float = Query(
            0.0,
            allow_inf_nan=False,
            description="Unix seconds: only points after this time (default: all).",
        ),
    ) -> HistoryOut:
        """The history points after `since`, for curves of the run."""
        points = await service.history(since)
        s = service.settings
        return HistoryOut(
            now_s=service.now_s(),
            interval_s=s.history_interval_s,
            span_s=s.history_span_s,
            points=[point_out(p) for p in points],
        )

    @app.post(
        "/v1/evaluations",
        response_model=HistoryPointOut,
        dependencies=[Depends(d) for d in write_dependencies],
        responses=errors(*write_errors),
    )
    async def post_evaluation(body: EvaluationIn) -> HistoryPointOut:
        """Adds held-out metrics of a weight version to the history (`tba local` posts its
        accuracy of each version)."""
        evaluation = Evaluation(version=body.version, step=body.step, metrics=body.metrics)
        return point_out(await service.record_evaluation(evaluation))
