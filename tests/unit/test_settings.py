import pytest
from pydantic import ValidationError

from tba.buffer.config import BufferServeSettings
from tba.cli import run_sections
from tba.inputs import InputError, check_model
from tba.models.config import ModelSettings
from tba.settings import RunFileError, load_settings, nest_dotted, validate_run_file
from tba.trainer.config import TrainerRunSettings


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


def test_hub_ids_and_existing_directories_are_models(tmp_path):
    for source in ("gpt2", "realtreetune/rho-1b-sft-GSM8K", str(tmp_path)):
        check_model(source, "run.toml", "[model] source")
    with pytest.raises(InputError, match=r"run\.toml: \[model\] source"):
        check_model(str(tmp_path / "missing"), "run.toml", "[model] source")


def test_every_commands_sections_form_one_union():
    sections = run_sections()
    assert {"trainer", "searcher", "buffer", "local", "eval", "model", "task"} <= set(sections)
    assert sections["model"] is ModelSettings
