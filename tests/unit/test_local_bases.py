import json

import pytest

from tba.local.bases import (
    CHECKSUMS,
    DEMO_BASE,
    CorruptBaseError,
    verified_base,
    write_checksums,
)
from tba.local.config import BootstrapSettings, LocalRunSettings, LocalSettings
from tba.local.run import LocalRun
from tba.tasks.arithmetic import ArithmeticTask


def test_the_committed_demo_base_matches_its_checksums():
    base = verified_base(DEMO_BASE)
    names = {line.split()[1] for line in (base / CHECKSUMS).read_text().splitlines()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    assert json.loads((base / "config.json").read_text())["model_type"] == "gpt2"


def test_a_changed_file_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    write_checksums(tmp_path)
    assert verified_base(tmp_path) == tmp_path
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    with pytest.raises(CorruptBaseError, match=r"model\.safetensors"):
        verified_base(tmp_path)


def test_a_missing_checksum_file_or_listed_file_is_refused(tmp_path):
    with pytest.raises(CorruptBaseError, match="SHA256SUMS"):
        verified_base(tmp_path)
    (tmp_path / "a.json").write_text("{}")
    write_checksums(tmp_path)
    (tmp_path / "a.json").unlink()
    with pytest.raises(CorruptBaseError, match=r"a\.json"):
        verified_base(tmp_path)


def test_tba_local_starts_from_the_committed_base_unless_told_otherwise(tmp_path):
    settings = LocalRunSettings(local=LocalSettings(run_dir=str(tmp_path)))
    assert LocalRun(settings)._base_model(ArithmeticTask()) == DEMO_BASE
    given = LocalRunSettings(local=LocalSettings(run_dir=str(tmp_path), model=str(tmp_path)))
    assert LocalRun(given)._base_model(ArithmeticTask()) == tmp_path


def test_bootstrap_settings_without_the_bootstrap_base_are_refused(tmp_path):
    settings = LocalRunSettings(
        local=LocalSettings(run_dir=str(tmp_path)), bootstrap=BootstrapSettings(seed=3)
    )
    with pytest.raises(SystemExit, match=r"local\.base"):
        LocalRun(settings)._base_model(ArithmeticTask())
