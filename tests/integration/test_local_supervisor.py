"""`tba local` starts its services together and stops them together: Ctrl-C (SIGINT) or SIGTERM
leaves no process behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tba.local.report import read_jsonl
from tba.local.supervisor import Supervisor
from tests.fixtures.tba_processes import wait_for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_supervisor_stops_in_reverse_order_and_kills_the_stubborn(tmp_path):
    supervisor = Supervisor(tmp_path / "logs", grace_s=1.0)
    ignores_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    first = supervisor.start("first", [sys.executable, "-c", "import time; time.sleep(60)"])
    second = supervisor.start(
        "second", [sys.executable, "-c", ignores_term + "print('up', flush=True); time.sleep(60)"]
    )
    second.wait_for_line("up", timeout_s=30)
    supervisor.stop_all()
    assert first.proc.returncode == -signal.SIGTERM
    assert second.proc.returncode == -signal.SIGKILL
    assert "up" in (tmp_path / "logs" / "second.log").read_text()


def _forked_main(code: object) -> None:
    print(f"up, TBA_X={os.environ.get('TBA_X')}", flush=True)
    if code == "raise":
        raise ValueError("broken service")
    if code == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    sys.exit(code)


@pytest.mark.parametrize(
    ("code", "returncode", "logged"),
    [(None, 0, "up, TBA_X=1"), (3, 3, "up"), ("bad", 1, "bad"), ("raise", 1, "broken service")],
)
def test_a_forked_child_exits_as_a_python_process_would(tmp_path, code, returncode, logged):
    supervisor = Supervisor(tmp_path / "logs")
    child = supervisor.fork("svc", lambda: _forked_main(code), {"TBA_X": "1"})
    assert child.proc.wait(timeout=30) == returncode
    assert "TBA_X" not in os.environ
    wait_for("the child's log", lambda: logged in (tmp_path / "logs" / "svc.log").read_text())
    assert supervisor.failed() is (child if returncode else None)


def test_a_forked_child_that_ignores_sigterm_is_killed(tmp_path):
    supervisor = Supervisor(tmp_path / "logs", grace_s=1.0)
    child = supervisor.fork("stubborn", lambda: _forked_main("ignore-term"))
    child.wait_for_line("up", timeout_s=30)
    supervisor.stop_all()
    assert child.proc.returncode == -signal.SIGKILL
    assert not _alive(child.proc.pid)


# Ctrl-C with the services forked (the default), SIGTERM with each a new program.
@pytest.mark.parametrize(
    ("signum", "start_method"),
    [(signal.SIGINT, "fork"), (signal.SIGTERM, "exec")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stop_signal_stops_every_service(tmp_path, demo_base_model, signum, start_method):
    cmd = [sys.executable, "-m", "tba", "local", "--run-dir", str(tmp_path / "run")]
    cmd += ["--model", str(demo_base_model), "--steps", "100000", "--set", "local.progress=false"]
    cmd += ["--set", f"local.start_method={start_method}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "started trainer" in line:
            break
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", "".join(lines))]
    assert len(pids) == 3, lines  # buffer, searcher, trainer
    trainer_metrics = tmp_path / "run" / "metrics" / "trainer.jsonl"
    wait_for("the trainer's first metrics row", lambda: read_jsonl(trainer_metrics))
    proc.send_signal(signum)
    output = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, output
    assert "interrupted" in output and "stopping every service" in output
    assert not [pid for pid in pids if _alive(pid)], output
    # The summary counts the steps the trainer did, though the run was stopped mid-way.
    last_step = read_jsonl(trainer_metrics)[-1]["step"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == last_step >= 1


def test_the_run_stops_at_its_target_even_when_signalled_while_it_stops(tmp_path, demo_base_model):
    # The base itself (0.44) is past a target of 0.05: the run ends at its first evaluation.
    # A caller that stops it at the same time (bench local does) must not break that stop.
    cmd = [sys.executable, "-m", "tba", "local", "--run-dir", str(tmp_path / "run")]
    cmd += ["--model", str(demo_base_model), "--steps", "100000", "--set", "local.progress=false"]
    cmd += ["--set", "local.stop_at_accuracy=0.05"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "stopping every service" in line:
            proc.send_signal(signal.SIGTERM)
            break
    output = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, output
    assert "held-out accuracy reached 0.05" in output
    assert "held-out accuracy, final" in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] < 100000
