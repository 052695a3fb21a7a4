"""The buffer's history over REST, through a real `tba buffer serve`: interval points of the
buffer's state, the trainer's step metrics sent with Sample, evaluations posted."""

import httpx
import pytest

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, SampleSpec, TrainerReport, new_request_id
from tests.fixtures.buffer_service import start_buffer, wait_for_history
from tests.fixtures.data import trajectory

TOKEN = "history-token-0123456789"
REPORT = TrainerReport(12, 1.25, 0.03, -1.5, 2e-4, 0.8, 0.4, 0.1)


@pytest.fixture
def fast_history(tmp_path):
    """A buffer that appends a history point every 0.2 s, with a token."""
    args = ["--set", "buffer.history_interval_s=0.2", "--set", f"buffer.auth_token={TOKEN}"]
    service = start_buffer(tmp_path, *args)
    yield service
    service.stop()


def test_history_holds_the_buffer_the_trainer_and_evaluations(fast_history):
    url = fast_history.http_url
    client_settings = BufferClientSettings(address=fast_history.address, auth_token=TOKEN)
    with BufferClient(client_settings) as client:
        (pid,) = client.put_prompts([Prompt("", "1+2=", "3")]).prompt_ids
        batch = [trajectory(pid, completion=[4, k], reward=k / 4) for k in range(4)]
        client.add_trajectories(batch, searcher_id="s1", request_id=new_request_id())
        client.sample(SampleSpec(1, 2, 0.5, report=REPORT))
    auth = {"authorization": f"Bearer {TOKEN}"}
    body = {"version": 2, "step": 12, "metrics": {"accuracy": 0.75}}
    assert httpx.post(f"{url}/v1/evaluations", json=body, timeout=10).status_code == 401
    posted = httpx.post(f"{url}/v1/evaluations", json=body, headers=auth, timeout=10)
    assert posted.status_code == 200, posted.text
    points = wait_for_history(url, 4)
    states = [p["buffer"] for p in points if p["buffer"]]
    assert states[-1]["trajectories"] == 4 and states[-1]["prompts"] == 1
    assert states[-1]["reward_mean"] == pytest.approx(0.375)
    assert states[-1]["active_searchers"] == 1
    reports = [p["trainer"] for p in points if p["trainer"]]
    assert reports == [
        {
            "step": 12,
            "loss": 1.25,
            "kl": 0.03,
            "log_z": -1.5,
            "lr": 2e-4,
            "grad_norm": 0.8,
            "step_time_s": 0.4,
            "wait_data_s": 0.1,
        }
    ]  # once: in the first point after the Sample call
    (evaluation,) = [p for p in points if p["evaluation"]]
    assert evaluation == {**posted.json(), "buffer": None, "trainer": None}
    assert evaluation["evaluation"] == body
    times = [p["at_s"] for p in points]
    assert times == sorted(times)
    later = httpx.get(f"{url}/v1/history", params={"since": times[1]}, timeout=10).json()
    assert [p["at_s"] for p in later["points"]][: len(times) - 2] == times[2:]
    assert later["interval_s"] == 0.2 and later["span_s"] == 86_400.0
    assert later["now_s"] >= times[-1]


@pytest.mark.parametrize("since", ["yesterday", "nan", "inf", ""])
def test_a_bad_since_is_422_with_a_message(fast_history, since):
    reply = httpx.get(f"{fast_history.http_url}/v1/history?since={since}", timeout=10)
    assert reply.status_code == 422
    assert "since" in str(reply.json()["detail"])


@pytest.mark.parametrize(
    "body",
    [
        {"version": 1, "metrics": {}},
        {"version": -1, "metrics": {"accuracy": 0.5}},
        {"version": 1, "metrics": {"bad name": 0.5}},
        {"metrics": {"accuracy": 0.5}},
        # JSON types as the schema states them: no booleans or strings read as numbers.
        {"version": 1, "metrics": {"accuracy": False}},
        {"version": True, "metrics": {"accuracy": 0.5}},
        {"version": 1, "metrics": {"accuracy": "0.5"}},
    ],
)
def test_bad_evaluations_are_422_and_add_nothing(fast_history, body):
    auth = {"authorization": f"Bearer {TOKEN}"}
    url = fast_history.http_url
    reply = httpx.post(f"{url}/v1/evaluations", json=body, headers=auth, timeout=10)
    assert reply.status_code == 422 and reply.json()["detail"]
    points = httpx.get(f"{url}/v1/history", timeout=10).json()["points"]
    assert not any(p["evaluation"] for p in points)


def test_openapi_documents_the_history(fast_history):
    schema = httpx.get(f"{fast_history.http_url}/openapi.json", timeout=10).json()
    get = schema["paths"]["/v1/history"]["get"]
    assert get["parameters"][0]["name"] == "since"
    assert get["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HistoryOut"
    }
    models = schema["components"]["schemas"]
    assert {"buffer", "trainer", "evaluation"} <= set(models["HistoryPointOut"]["properties"])
    assert "loss" in models["TrainerReportOut"]["properties"]
    post = schema["paths"]["/v1/evaluations"]["post"]
    assert post["security"] == [{"HTTPBearer": []}]


def test_tba_locals_evaluations_reach_the_history_with_the_token(fast_history, caplog):
    from tba.local.evaluator import EvalPoint, EvaluationPoster

    EvaluationPoster(fast_history.http_url, TOKEN)(EvalPoint(3.0, 1, 4, 0.5))
    EvaluationPoster(fast_history.http_url, None)(EvalPoint(6.0, 2, 8, 0.75))
    assert "version 2's accuracy not posted to the buffer" in caplog.text  # 401: no token
    EvaluationPoster("http://127.0.0.1:9", TOKEN, timeout_s=1)(EvalPoint(6.0, 2, 8, 0.75))
    points = httpx.get(f"{fast_history.http_url}/v1/history", timeout=10).json()["points"]
    evaluations = [p["evaluation"] for p in points if p["evaluation"]]
    assert evaluations == [{"version": 1, "step": 4, "metrics": {"accuracy": 0.5}}]
