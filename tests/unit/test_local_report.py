import json
from pathlib import Path

from tba.local.evaluator import EvalPoint
from tba.local.report import JsonlTail, first_time_reaching, read_jsonl, summarize


def _points():
    return [
        EvalPoint(0.0, 0, 0, 0.40),
        EvalPoint(30.0, 3, 6, 0.55),
        EvalPoint(60.0, 6, 12, 0.70),
        EvalPoint(90.0, 9, 18, 0.82),
        EvalPoint(120.0, 12, 24, 0.78),
    ]


def test_first_time_reaching_is_the_first_point_at_or_above():
    assert first_time_reaching(_points(), 0.70) == 60.0
    assert first_time_reaching(_points(), 0.95) is None


def test_summary_measures_from_the_base_evaluation():
    summary = summarize("async", _points(), steps=24, wall_s=130.0)
    assert summary.base_accuracy == 0.40
    assert summary.final_accuracy == 0.78
    assert summary.best_accuracy == 0.82
    assert summary.versions == 4
    assert summary.seconds_to == {"base + 0.25": 60.0, "0.80": 90.0, "0.90": None}
    rows = dict(summary.rows())
    assert rows["time to 0.90 (s)"] == "not reached"
    assert rows["held-out accuracy, base"] == "0.400"


def _line(step: int) -> bytes:
    return json.dumps({"step": step, "trainer/reward_mean": 0.5}).encode() + b"\n"


def test_jsonl_tail_reads_only_rows_completed_since_its_last_read(tmp_path: Path) -> None:
    path = tmp_path / "trainer.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []  # the trainer has not written yet
    path.write_bytes(_line(1) + _line(2))
    assert [r["step"] for r in tail.read_new()] == [1, 2]
    assert tail.read_new() == []
    third = _line(3)
    with path.open("ab") as f:
        f.write(third[:20])  # the writer's buffer went out mid-line
    assert tail.read_new() == []
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    with path.open("ab") as f:
        f.write(third[20:] + _line(4))
    assert [r["step"] for r in tail.read_new()] == [3, 4]
