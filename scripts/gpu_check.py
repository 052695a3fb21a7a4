"""The GPU check's driver (run it through scripts/gpu_check.sh, which documents the machine it is
for): the buffer, a bf16 trainer and a searcher on the tiny demo model for about 50 steps,
through one run file written from configs/arithmetic-demo.toml, once with the transformers
engine and once with vLLM where it is importable. Prints one line per check (`PASS name:
detail`, `FAIL name: detail`, `SKIP name: why`) and exits 1 on any FAIL.

`--dry-run` (or GPU_CHECK_DEVICE=cpu) runs the same flow on CPU with fewer steps and without
vLLM; the test suite runs it (tests/integration/test_gpu_check.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

REPO = Path(__file__).resolve().parents[1]
DEMO_RUN_FILE = REPO / "configs" / "arithmetic-demo.toml"
STARTED = re.compile(r"started (\S+) \(pid (\d+)\)")
LOADED = re.compile(r"loaded weight version (\d+)")
# On a GPU the whole check stays under 5 minutes: each run gets what is left of this, at most
# its own. The dry run trains bf16 on the CPU, which a CPU without bf16 instructions emulates
# (5x slower than fp32 on a 2017 EPYC): it gets more, within the test's 10 minutes.
TOTAL_BUDGET_S = {"cuda": 285.0, "cpu": 500.0}
RUN_TIMEOUT_S = {"cuda": {"transformers": 150.0, "vllm": 180.0}, "cpu": {"transformers": 480.0}}


@dataclass
class Report:
    failures: int = 0

    def check(self, name: str, ok: bool, detail: str) -> bool:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.failures += 0 if ok else 1
        return ok

    def skip(self, name: str, why: str) -> None:
        print(f"SKIP {name}: {why}", flush=True)


@dataclass
class Run:
    """One `tba local` run of the check's run file and what it left behind."""

    engine: str
    run_dir: Path
    returncode: int
    output: str
    wall_s: float
    gpu_pids: set[int] = field(default_factory=set)

    @property
    def pids(self) -> dict[str, int]:
        return {name: int(pid) for name, pid in STARTED.findall(self.output)}

    def jsonl(self, relative: str) -> list[dict[str, Any]]:
        path = self.run_dir / relative
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def child_config(self, relative: str) -> dict[str, Any]:
        path = self.run_dir / relative
        return tomllib.loads(path.read_text()) if path.is_file() else {}

    def log(self, name: str) -> str:
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""


def run_file(device: str, engine: str, steps: int, run_dir: Path) -> dict[str, Any]:
    """The demo's run file with this machine's device, bf16 training and the engine."""
    sections = tomllib.loads(DEMO_RUN_FILE.read_text())
    sections["trainer"].update(steps=steps, device=device)
    sections["model"].update(dtype="bf16")
    sections["engine"] = {"kind": engine, "device": device}
    if engine == "vllm":
        # The trainer shares the GPU; graph capture would cost a minute of the 5.
        sections["engine"].update(gpu_memory_utilization=0.3, enforce_eager=True)
    sections["local"] = {
        "run_dir": str(run_dir),
        "eval_prompts": 500,
        "eval_interval_s": 2.0,
        "progress": False,
        # More than one torch thread per process helps on a GPU machine's many cores.
        "threads_per_process": 1 if device == "cpu" else 4,
    }
    return sections


def validate_run_file(path: Path, device: str, report: Report) -> bool:
    """Every service resolves the run file: the trainer trains bf16 on `device`, the
    searcher generates on it."""
    resolved = {}
    for command in (["buffer", "serve"], ["trainer", "run"], ["searcher", "run"], ["local"]):
        done = tba(*command, "--config", str(path), "--print-config", timeout_s=120)
        if done.returncode != 0:
            return report.check("run-file", False, f"tba {' '.join(command)}: {done.stderr}")
        resolved[command[0]] = tomllib.loads(done.stdout)
    trainer, searcher = resolved["trainer"], resolved["searcher"]
    ok = (
        trainer["trainer"]["device"] == searcher["engine"]["device"] == device
        and trainer["model"]["dtype"] == "bf16"
        and trainer["searcher"]["temperature"] == searcher["searcher"]["temperature"]
    )
    detail = (
        f"{path.name}: trainer {trainer['trainer']['device']} {trainer['model']['dtype']}, "
        f"searcher {searcher['engine']['kind']} on {searcher['engine']['device']}, "
        f"temperature {searcher['searcher']['temperature']} on both sides"
    )
    return report.check("run-file", ok, detail)


def tba(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tba", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=child_env(),
        check=False,
    )


def child_env() -> dict[str, str]:
    """This checkout's `tba` (no install needed) and no TBA_* settings from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TBA_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    return env


def run_local(config: Path, engine: str, run_dir: Path, on_gpu: bool, timeout_s: float) -> Run:
    """`tba local --config` to the end, watching which processes hold GPU memory."""
    watcher = GpuWatcher() if on_gpu else None
    started = time.monotonic()
    try:
        if watcher is not None:
            watcher.start()
        done = subprocess.run(
            [sys.executable, "-m", "tba", "local", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            check=False,
        )
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, output = -1, _text(exc.stdout) + _text(exc.stderr) + "\n(timed out)"
    finally:
        if watcher is not None:
            watcher.stop()
    pids = watcher.pids if watcher is not None else set()
    return Run(engine, run_dir, returncode, output, time.monotonic() - started, pids)


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


class GpuWatcher:
    """The pids that hold GPU memory during a run, from nvidia-smi once a second."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.listed_any = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _poll(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
        while not self._stop.wait(1.0):
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return
            self.pids.update(int(word) for word in out.split() if word.isdigit())


def check_run(run: Run, device: str, steps: int, report: Report) -> None:
    name = run.engine
    summary = run.run_dir / "summary.json"
    done = run.returncode == 0 and summary.is_file()
    trained = json.loads(summary.read_text())["steps"] if done else 0
    detail = f"{trained} of {steps} steps in {run.wall_s:.0f} s"
    if not report.check(f"{name}/run", done and trained == steps, detail):
        print(_tail(run.output), flush=True)
        return
    check_devices(run, device, report)
    check_hot_reload(run, report)
    check_learning(run, report)


def check_devices(run: Run, device: str, report: Report) -> None:
    """What each service was told (its child config) and, on a GPU, that it holds memory."""
    trainer = run.child_config("trainer.toml")
    searcher = run.child_config("searcher-0/searcher.toml")
    told = {
        "trainer": (trainer["trainer"].get("device"), trainer["model"].get("dtype")),
        "searcher-0": (searcher["engine"].get("device"), searcher["engine"].get("kind")),
    }
    # In a container nvidia-smi may list no process, or the host's pids: then no service's
    # pid is among them and the settings are all there is to check.
    attributable = bool(run.gpu_pids & set(run.pids.values()))
    for service, (service_device, what) in told.items():
        ok = service_device == device
        detail = f"{what} on {service_device}"
        if device == "cuda" and attributable:
            on_gpu = run.pids.get(service) in run.gpu_pids
            ok = ok and on_gpu
            holds = "holds" if on_gpu else "does not hold"
            detail += f", pid {run.pids.get(service)} {holds} GPU memory"
        elif device == "cuda":
            detail += " (nvidia-smi shows none of this run's pids: not attributed)"
        report.check(f"{run.engine}/{service}-device", ok, detail)


def check_hot_reload(run: Run, report: Report) -> None:
    """The searcher loaded newer weight versions while it ran, without a restart."""
    versions = [int(v) for v in LOADED.findall(run.log("searcher-0"))]
    ok = len(set(versions)) >= 3 and versions == sorted(versions)
    first, last = (versions[0], versions[-1]) if versions else (0, 0)
    detail = f"{len(set(versions))} versions loaded, {first} -> {last}"
    report.check(f"{run.engine}/hot-reload", ok, detail)


def check_learning(run: Run, report: Report) -> None:
    """Mean training reward of the last third of the steps above the first third's, or the
    final version's held-out greedy accuracy above the base model's."""
    rewards = [row["trainer/reward_mean"] for row in run.jsonl("metrics/trainer.jsonl")]
    third = max(1, len(rewards) // 3)
    early, late = _mean(rewards[:third]), _mean(rewards[-third:])
    points = run.jsonl("eval.jsonl")
    base, final = (points[0]["accuracy"], points[-1]["accuracy"]) if points else (0.0, 0.0)
    ok = late > early or final > base
    detail = (
        f"reward {early:.3f} -> {late:.3f} (first and last third of {len(rewards)} steps), "
        f"held-out accuracy {base:.3f} -> {final:.3f}"
    )
    report.check(f"{run.engine}/learning", ok, detail)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def check_cuda(report: Report) -> bool:
    import torch

    if not torch.cuda.is_available():
        return report.check("cuda", False, f"torch {torch.__version__} sees no CUDA device")
    name = torch.cuda.get_device_name(0)
    bf16 = torch.cuda.is_bf16_supported()
    return report.check("cuda", bf16, f"{name}, torch {torch.__version__}, bf16 {bf16}")


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # any failure to import it (a broken build too) means: no vLLM
        return False
    return True


def engines(dry_run: bool, report: Report) -> list[str]:
    if dry_run:
        report.skip("vllm", "dry run: the transformers engine only")
        return ["transformers"]
    if not vllm_importable():
        report.skip("vllm", "vllm is not importable here")
        return ["transformers"]
    return ["transformers", "vllm"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on CPU, fewer steps, no vLLM")
    parser.add_argument("--steps", type=int, default=None, help="trainer steps (60; 50 dry)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep run files here")
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or os.environ.get("GPU_CHECK_DEVICE") == "cpu"
    args.steps = args.steps or (50 if args.dry_run else 60)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    report = Report()
    if device == "cuda" and not check_cuda(report):
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tba-gpu-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"gpu check: {device}, {args.steps} steps, files in {workdir}", flush=True)
    deadline = time.monotonic() + TOTAL_BUDGET_S[device]
    for engine in engines(args.dry_run, report):
        config = workdir / f"run-{engine}.toml"
        run_dir = workdir / engine
        shutil.rmtree(run_dir, ignore_errors=True)
        config.write_text(tomli_w.dumps(run_file(device, engine, args.steps, run_dir)))
        if not validate_run_file(config, device, report):
            continue
        timeout_s = min(RUN_TIMEOUT_S[device][engine], deadline - time.monotonic())
        if timeout_s < 30:
            report.check(f"{engine}/run", False, f"no time left of {TOTAL_BUDGET_S[device]:.0f} s")
            continue
        run = run_local(config, engine, run_dir, device == "cuda", timeout_s)
        check_run(run, device, args.steps, report)
    print(f"gpu check: {report.failures} failed", flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
