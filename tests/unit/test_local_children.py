import tomllib
from pathlib import Path

from pydantic import SecretStr

from tba.local import children
from tba.local.config import LocalRunSettings
from tba.searcher.config import SearcherRunSettings
from tba.settings import load_settings
from tba.trainer.config import TrainerRunSettings


def _settings(tmp_path: Path, **local: object) -> LocalRunSettings:
    return LocalRunSettings(local={"run_dir": str(tmp_path), **local})


def test_weights_default_to_the_run_directory(tmp_path):
    assert _settings(tmp_path).objectstore.uri == f"file://{tmp_path}/weights"
    explicit = LocalRunSettings(objectstore={"uri": "s3://bucket/w"})
    assert explicit.objectstore.uri == "s3://bucket/w"


def test_child_configs_load_into_the_child_commands(tmp_path):
    settings = _settings(tmp_path)
    base = tmp_path / "base"
    trainer_toml = children.trainer_config(settings, tmp_path, base, "127.0.0.1:5")
    trainer = load_settings(TrainerRunSettings, trainer_toml)
    assert trainer.model.source == str(base)
    assert trainer.client.address == "127.0.0.1:5"
    assert trainer.trainer == settings.trainer
    searcher_toml = children.searcher_config(settings, tmp_path, base, "127.0.0.1:5", 1)
    searcher = load_settings(SearcherRunSettings, searcher_toml)
    assert searcher.searcher.id == "searcher-1"
    assert searcher.searcher.seed == settings.searcher.seed + 1
    assert searcher.task == settings.task
    assert searcher.objectstore.uri == settings.objectstore.uri


def test_secrets_go_by_environment_never_into_files(tmp_path):
    settings = LocalRunSettings(
        local={"run_dir": str(tmp_path)},
        objectstore={
            "uri": "s3://bucket/w",
            "access_key_id": SecretStr("key-id"),
            "secret_access_key": SecretStr("very-secret"),
        },
    )
    path = children.trainer_config(settings, tmp_path, tmp_path, "127.0.0.1:5")
    assert "very-secret" not in path.read_text()
    assert "objectstore" in tomllib.loads(path.read_text())
    assert children.secret_env(settings) == {
        "TBA_OBJECTSTORE__ACCESS_KEY_ID": "key-id",
        "TBA_OBJECTSTORE__SECRET_ACCESS_KEY": "very-secret",
    }


def test_sync_mode_is_on_policy(tmp_path):
    settings = _settings(tmp_path, mode="sync", searchers=2)
    settings.trainer.initial_buffer_completions = 500
    children.apply_mode(settings)
    trainer, searcher = settings.trainer, settings.searcher
    assert trainer.publish_every_steps == 1
    assert trainer.recency_probability == 1.0
    assert trainer.max_age_versions == 0
    assert trainer.min_batch_prompts == trainer.num_prompts
    assert trainer.initial_buffer_completions == 0
    assert searcher.one_round_per_version and searcher.min_version == 1
    assert searcher.prompts_per_round * 2 >= trainer.num_prompts


def test_async_mode_keeps_the_settings(tmp_path):
    settings = _settings(tmp_path)
    before = settings.model_copy(deep=True)
    children.apply_mode(settings)
    assert settings == before


def test_the_buffer_token_goes_to_every_child_by_environment(tmp_path):
    settings = LocalRunSettings(
        local={"run_dir": str(tmp_path)}, buffer={"auth_token": SecretStr("t" * 24)}
    )
    assert "t" * 24 not in children.buffer_config(settings, tmp_path).read_text()
    env = children.secret_env(settings)
    assert env["TBA_BUFFER__AUTH_TOKEN"] == env["TBA_CLIENT__AUTH_TOKEN"] == "t" * 24


def test_services_fork_where_torch_runs_on_one_thread(tmp_path):
    assert children.forks(_settings(tmp_path))  # auto, one thread per process
    assert not children.forks(_settings(tmp_path, threads_per_process=2))
    assert not children.forks(_settings(tmp_path, start_method="exec"))
    assert children.forks(_settings(tmp_path, start_method="fork", threads_per_process=2))
