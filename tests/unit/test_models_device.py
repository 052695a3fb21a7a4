"""pick_device and pick_dtype: the settings' device and dtype names as torch values."""

from __future__ import annotations

import pytest
import torch

from tba.models import device as device_module
from tba.models.device import pick_device, pick_dtype


def test_cpu_is_cpu_whatever_the_machine():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("cpu", index=1) == torch.device("cpu")


def test_cuda_is_cuda_with_or_without_an_index():
    assert pick_device("cuda") == torch.device("cuda")
    assert pick_device("cuda", index=3) == torch.device("cuda", 3)


@pytest.mark.parametrize("available", [True, False])
def test_auto_takes_cuda_where_available(monkeypatch, available):
    monkeypatch.setattr(device_module.torch.cuda, "is_available", lambda: available)
    assert pick_device("auto", index=2) == (
        torch.device("cuda", 2) if available else torch.device("cpu")
    )


def test_auto_dtype_is_bf16_on_a_gpu_and_fp32_on_the_cpu():
    assert pick_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32


@pytest.mark.parametrize(
    ("name", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_named_dtypes_hold_on_any_device(name, dtype):
    assert pick_dtype(name, torch.device("cpu")) == dtype
    assert pick_dtype(name, torch.device("cuda")) == dtype
