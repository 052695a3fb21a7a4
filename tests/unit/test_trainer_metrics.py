import io
import json

from tba.trainer.metrics import FanOut, JsonlSink, StdoutSink


def test_jsonl_and_stdout_sinks(tmp_path):
    stream = io.StringIO()
    sink = FanOut(
        [JsonlSink(tmp_path / "m" / "metrics.jsonl", clock=lambda: 7.5), StdoutSink(stream)]
    )
    sink.write(1, {"trainer/loss": 0.5, "time/compute_s": 0.25})
    sink.write(2, {"trainer/loss": 0.125})
    sink.close()
    lines = (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "time_s": 7.5, "trainer/loss": 0.5, "time/compute_s": 0.25},
        {"step": 2, "time_s": 7.5, "trainer/loss": 0.125},
    ]
    assert stream.getvalue().splitlines()[0] == "step 1 trainer/loss=0.5 time/compute_s=0.25"
