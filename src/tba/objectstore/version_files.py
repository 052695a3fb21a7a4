"""The files of one weight version, written into a folder for `publish_weights`.

The first version is written by transformers (`save_pretrained` of the model and of the
tokenizer). When that wrote one safetensors file holding exactly tensors of the given state
dict, under their own names and equal in value (no conversion of names or layouts on the
way), every later version with a state dict of the same names, shapes and dtypes saves those
tensors directly and writes the other files (config, tokenizer) with the bytes of the first:
the same files as `save_pretrained` would write, without transformers serialising the config
and the tokenizer again each version (two thirds of a tiny model's publish). Anything else
(sharded files, converted weights, no state dict) goes through `save_pretrained` each time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file


@dataclass(frozen=True)
class _DirectWrite:
    """What the first `save_pretrained` wrote, to write again with new tensors."""

    weights_file: str
    tensors: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    metadata: dict[str, str] | None
    other_files: dict[str, bytes]

    def fits(self, state_dict: Mapping[str, torch.Tensor]) -> bool:
        return all(
            name in state_dict and (state_dict[name].dtype, tuple(state_dict[name].shape)) == spec
            for name, spec in self.tensors.items()
        )

    def write(self, folder: Path, state_dict: Mapping[str, torch.Tensor]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: state_dict[name].contiguous() for name in self.tensors}
        save_file(tensors, str(folder / self.weights_file), metadata=self.metadata)
        for name, data in self.other_files.items():
            (folder / name).write_bytes(data)


def _learn_direct_write(
    folder: Path, state_dict: Mapping[str, torch.Tensor]
) -> _DirectWrite | None:
    """The direct write for what `save_pretrained` put in `folder` from `state_dict`; None
    when that was not one safetensors file of the state dict's own tensors."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    weights = [p for p in files if p.suffix == ".safetensors"]
    if len(weights) != 1:
        return None
    tensors = {}
    with safe_open(str(weights[0]), framework="pt") as saved:
        metadata = saved.metadata()
        for name in saved.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            tensor = saved.get_tensor(name)
            given = state_dict.get(name)
            if given is None or given.dtype != tensor.dtype or not torch.equal(given, tensor):
                return None
            tensors[name] = (tensor.dtype, tuple(tensor.shape))
    other = {p.name: p.read_bytes() for p in files if p != weights[0]}
    return _DirectWrite(weights[0].name, tensors, metadata, other)


class VersionFiles:
    """Writes the model's and the tokenizer's files of each version (see the module)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._direct: _DirectWrite | None = None
        self._learned = False

    @property
    def direct(self) -> bool:
        """Whether later versions are written without `save_pretrained`."""
        return self._direct is not None

    def write(self, folder: Path, state_dict: Mapping[str, torch.Tensor] | None) -> None:
        if state_dict is not None and self._direct is not None and self._direct.fits(state_dict):
            self._direct.write(folder, state_dict)
            return
        save_pretrained_files(folder, self.model, self.tokenizer, state_dict)
        if state_dict is not None and not self._learned:
            self._learned = True
            self._direct = _learn_direct_write(folder, state_dict)


def save_pretrained_files(
    folder: Path, model: Any, tokenizer: Any, state_dict: Mapping[str, torch.Tensor] | None
) -> None:
    """One version's files as transformers writes them (`state_dict` overrides the model's
    tensors), the config naming the dtype of the files."""
    # save_pretrained empties the dict it is given: a retry must find its tensors.
    given = dict(state_dict) if state_dict is not None else None
    model.save_pretrained(folder, state_dict=given, safe_serialization=True)
    if state_dict is not None:
        _record_dtype(folder / "config.json", state_dict)
    tokenizer.save_pretrained(folder)


def _record_dtype(config_path: Path, state_dict: Mapping[str, Any]) -> None:
    """save_pretrained writes the model's own parameter dtype into the config; the files
    hold `state_dict`'s (a bf16 export of fp32 master weights)."""
    floating = [t.dtype for t in state_dict.values() if t.is_floating_point()]
    if not floating:
        return
    config = json.loads(config_path.read_text())
    config["dtype"] = str(floating[0]).removeprefix("torch.")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
