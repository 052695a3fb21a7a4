"""`VersionFiles`: after the first version, the files are written without `save_pretrained`,
byte for byte as it writes them; a model whose saved tensors are not its state dict's own
keeps going through `save_pretrained`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.objectstore.version_files import VersionFiles
from tba.trainer.publish import take_snapshot


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2, seed=3), tokenizer


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _snapshot(model: Any, dtype: torch.dtype, shift: float) -> dict[str, torch.Tensor]:
    state = take_snapshot(model.state_dict(), 0, dtype).state_dict
    return {n: t + shift if t.is_floating_point() else t for n, t in state.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_later_versions_are_the_files_save_pretrained_writes(tiny, tmp_path, dtype):
    model, tokenizer = tiny
    files = VersionFiles(model, tokenizer)
    files.write(tmp_path / "v1", _snapshot(model, dtype, 0.0))
    assert files.direct
    later = _snapshot(model, dtype, 0.25)
    files.write(tmp_path / "v2", later)
    VersionFiles(model, tokenizer).write(tmp_path / "reference", later)
    written, reference = _files(tmp_path / "v2"), _files(tmp_path / "reference")
    assert written.keys() == reference.keys() and "model.safetensors" in written
    assert written == reference
    assert written["model.safetensors"] != _files(tmp_path / "v1")["model.safetensors"]


class RenamingModel:
    """Saves its tensors under other names, as transformers does for models whose
    checkpoint layout differs from their modules'."""

    def __init__(self) -> None:
        self.saves = 0

    def save_pretrained(self, folder: Path, state_dict: dict[str, torch.Tensor], **_: Any) -> None:
        self.saves += 1
        folder.mkdir(parents=True, exist_ok=True)
        save_file(
            {f"checkpoint.{n}": t for n, t in state_dict.items()}, str(folder / "m.safetensors")
        )
        (folder / "config.json").write_text("{}")


def test_converted_weights_go_through_save_pretrained_every_time(tiny, tmp_path):
    _, tokenizer = tiny
    model = RenamingModel()
    files = VersionFiles(model, tokenizer)
    for version in (1, 2, 3):
        files.write(tmp_path / f"v{version}", {"w": torch.full((2,), float(version))})
    assert not files.direct and model.saves == 3


def test_a_state_dict_of_other_shapes_goes_through_save_pretrained(tiny, tmp_path):
    model, tokenizer = tiny
    files = VersionFiles(model, tokenizer)
    files.write(tmp_path / "v1", _snapshot(model, torch.float32, 0.0))
    other = _snapshot(model, torch.bfloat16, 0.5)
    files.write(tmp_path / "v2", other)
    VersionFiles(model, tokenizer).write(tmp_path / "reference", other)
    assert _files(tmp_path / "v2") == _files(tmp_path / "reference")
