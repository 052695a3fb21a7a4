"""The live progress line of `tba local` when its output goes to a file."""

from __future__ import annotations

import io

from tba.local.evaluator import EvalPoint
from tba.local.progress import ProgressView


def test_a_line_written_to_a_file_keeps_the_step_count_and_every_figure() -> None:
    log = io.StringIO()
    row = {
        "step": 1500,
        "trainer/reward_mean": 0.62,
        "trainer/version": 1501,
        "trainer/staleness_mean": 1.0,
    }
    with ProgressView(8000, file=log) as view:
        view.update([row], [EvalPoint(wall_s=101.0, version=1501, step=1500, accuracy=0.598)])
    line = log.getvalue().strip().splitlines()[-1]
    assert "1500/8000" in line
    assert "…" not in line
    assert line.endswith("held-out acc 0.598 (v1501)  version 1501  staleness 1.0")
