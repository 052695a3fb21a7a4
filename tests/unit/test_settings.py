import subprocess
import sys

import pytest
from pydantic import ValidationError

from tba.buffer.main import BufferServeSettings
from tba.settings import load_settings, nest_dotted


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
    with pytest.raises(ValidationError, match="grcp_port"):
        load_settings(BufferServeSettings, config)


def test_bad_store_url_is_an_error():
    with pytest.raises(ValidationError, match="store"):
        load_settings(BufferServeSettings, overrides={"buffer.store": "postgres://x"})


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
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
