from tba.local.evaluator import EvalPoint
from tba.local.report import first_time_reaching, summarize


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
