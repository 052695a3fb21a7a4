import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from tba.buffer.main import BufferServeSettings
from tba.cli import run_sections
from tba.inputs import InputError, check_model
from tba.models.config import ModelSettings
from tba.settings import RunFileError, load_settings, nest_dotted, validate_run_file
from tba.trainer.main import TrainerRunSettings


def test_defaults():
    settings = load_settings(BufferServeSettings)
    assert settings.buffer.store == "memory"
    assert settings.buffer.prompt_history == 100


def test_env_toml_and_flags_in_priority_order(tmp_path, monkeypatch):
    config = tmp_path / "run.toml"
    config.write_text("[buffer]\ngrpc_port = 1111\nhttp_port = 2222\ncapacity = 5\n")
    monkeypatch.setenv("TBA_BUFFER__HTTP_PORT", "3333")
    monkeypatch.setenv("TBA_BUFFER__CAPACITY", "6")
    settings = load_settings(BufferServeSettings, config, {"buffer.capacity": "7"})
    assert settings.buffer.grpc_port == 1111  # TOML
    assert settings.buffer.http_port == 3333  # env beats TOML
    assert settings.buffer.capacity == 7  # flags beat env


def test_bounds_are_enforced(monkeypatch):
    monkeypatch.setenv("TBA_BUFFER__GRPC_PORT", "70000")
    with pytest.raises(ValidationError, match="grpc_port"):
        load_settings(BufferServeSettings)


def test_unknown_toml_key_is_an_error(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[buffer]\ngrcp_port = 1\n")
    with pytest.raises(RunFileError, match="grcp_port"):
        load_settings(BufferServeSettings, config)


def test_bad_store_url_is_an_error():
    with pytest.raises(ValidationError, match="store"):
        load_settings(BufferServeSettings, overrides={"buffer.store": "postgres://x"})


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(RunFileError, match=r"nope\.toml: run file does not exist"):
        load_settings(BufferServeSettings, tmp_path / "nope.toml")


def test_nest_dotted():
    assert nest_dotted({"a.b": 1, "a.c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}


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


def write(tmp_path, text: str, name: str = "run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_run_file_holds_every_commands_sections_and_each_takes_its_own(tmp_path):
    config = write(tmp_path, "[buffer]\ncapacity = 5\n[trainer]\nsteps = 3\n[searcher]\nseed = 4\n")
    buffer = load_settings(BufferServeSettings, config, run_sections=run_sections())
    assert buffer.buffer.capacity == 5 and not hasattr(buffer, "trainer")
    trainer = load_settings(TrainerRunSettings, config, run_sections=run_sections())
    assert (trainer.trainer.steps, trainer.searcher.seed) == (3, 4)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[trainer]\nsteps = 3\n[trainr]\nsteps = 3\n", "unknown section [trainr]"),
        ("[searcher]\ntemprature = 1.0\n", "[searcher] temprature: unknown field"),
        ("[trainer]\nsteps = -1\n", "[trainer] steps: Input should be greater"),
        ("[task.gsm8k]\nverifier = 'exact'\n", "[task.gsm8k] verifier: Input should be"),
        ("trainer = 3\n", "trainer must be a [trainer] section"),
    ],
)
def test_a_bad_run_file_names_the_file_section_and_field(tmp_path, text, named):
    config = write(tmp_path, text)
    with pytest.raises(RunFileError) as caught:
        validate_run_file(config, run_sections())
    assert str(caught.value).startswith(f"{config}: ")
    assert named in str(caught.value)


def test_run_file_errors_never_echo_values(tmp_path):
    config = write(tmp_path, "[buffer]\nauth_token = 'hunter2-secret'\nstore = 'postgres://pw'\n")
    with pytest.raises(RunFileError) as caught:
        validate_run_file(config, run_sections())
    assert "[buffer] store" in str(caught.value)
    assert "hunter2" not in str(caught.value) and "postgres://pw" not in str(caught.value)


def test_a_run_file_that_is_not_toml_is_named(tmp_path):
    config = write(tmp_path, "[trainer\n")
    with pytest.raises(RunFileError, match=f"{config}: cannot read"):
        validate_run_file(config, run_sections())


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


def test_hub_ids_and_existing_directories_are_models(tmp_path):
    for source in ("gpt2", "realtreetune/rho-1b-sft-GSM8K", str(tmp_path)):
        check_model(source, "run.toml", "[model] source")
    with pytest.raises(InputError, match=r"run\.toml: \[model\] source"):
        check_model(str(tmp_path / "missing"), "run.toml", "[model] source")


def test_every_commands_sections_form_one_union():
    sections = run_sections()
    assert {"trainer", "searcher", "buffer", "local", "eval", "model", "task"} <= set(sections)
    assert sections["model"] is ModelSettings


def test_flags_and_env_name_the_field_they_got_wrong():
    done = run_tba("buffer", "serve", "--set", "bufer.capacity=3", "--print-config")
    assert done.returncode != 0 and "[bufer]: unknown section" in done.stderr
    done = run_tba("buffer", "serve", "--print-config", env={"TBA_BUFFER__CAPACITY": "-1"})
    assert "[buffer] capacity: Input should be greater" in done.stderr
    assert "Traceback" not in done.stderr
