"""The `tba` command line in a subprocess: run files, flags and env, refused on stderr without
a traceback; `--print-config` round trips."""

import os
import subprocess
import sys

import pytest

from tba.buffer.config import BufferServeSettings
from tba.settings import load_settings


def write(tmp_path, text: str, name: str = "run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_print_config_round_trips_through_toml(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tba", "buffer", "serve", "--grpc-port", "4444", "--print-config"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "grpc_port = 4444" in out
    config = tmp_path / "printed.toml"
    config.write_text(out)
    assert load_settings(BufferServeSettings, config).buffer.grpc_port == 4444


def run_tba(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TBA_")}
    return subprocess.run(
        [sys.executable, "-m", "tba", *args],
        capture_output=True,
        text=True,
        env={**environ, **(env or {})},
        check=False,
    )


def test_the_cli_refuses_a_bad_run_file_on_stderr_without_a_traceback(tmp_path):
    config = write(tmp_path, "[searcher]\ntemperature = 1.0\n[bogus]\nx = 1\n")
    done = run_tba("buffer", "serve", "--config", str(config), "--print-config")
    assert done.returncode != 0 and done.stdout == ""
    assert f"{config}: unknown section [bogus]" in done.stderr
    assert "Traceback" not in done.stderr


def test_tba_config_names_the_run_file_when_no_flag_does(tmp_path):
    from_env = write(tmp_path, "[buffer]\ncapacity = 11\n", "env.toml")
    from_flag = write(tmp_path, "[buffer]\ncapacity = 22\n", "flag.toml")
    env = {"TBA_CONFIG": str(from_env)}
    assert "capacity = 11" in run_tba("buffer", "serve", "--print-config", env=env).stdout
    flagged = run_tba("buffer", "serve", "--config", str(from_flag), "--print-config", env=env)
    assert "capacity = 22" in flagged.stdout
    missing = run_tba("buffer", "serve", "--print-config", env={"TBA_CONFIG": "/no/run.toml"})
    assert missing.returncode != 0 and "/no/run.toml: run file does not exist" in missing.stderr


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[model]\nsource = './no/such/model'\n", "[model] source: model directory"),
        ("[model]\nsource = 'not a model!'\n", "[model] source: 'not a model!' is neither"),
        ("[task]\nname = 'gsm9k'\n", "[task] name: unknown task 'gsm9k'"),
        (
            "[task]\nname = 'gsm8k'\n[task.gsm8k]\nsource = '/no/such/gsm8k'\n",
            "[task.gsm8k] source: '/no/such/gsm8k' does not exist",
        ),
        ("[task]\nname = 'redteam'\n", "[task.redteam] victim_model: required"),
        (
            "[task]\nname = 'preference'\n[task.preference]\nreward_model = 'tiny'\n",
            "[task.preference] reward_model: `tiny` task models are built by `tba local` only",
        ),
    ],
)
def test_a_model_or_task_that_cannot_load_is_refused_before_anything_starts(tmp_path, text, named):
    config = write(tmp_path, text)
    done = run_tba("searcher", "run", "--config", str(config))
    assert done.returncode != 0
    assert f"{config}: {named}" in done.stderr
    assert "Traceback" not in done.stderr


def test_flags_and_env_name_the_field_they_got_wrong():
    done = run_tba("buffer", "serve", "--set", "bufer.capacity=3", "--print-config")
    assert done.returncode != 0 and "[bufer]: unknown section" in done.stderr
    done = run_tba("buffer", "serve", "--print-config", env={"TBA_BUFFER__CAPACITY": "-1"})
    assert "[buffer] capacity: Input should be greater" in done.stderr
    assert "Traceback" not in done.stderr
