"""Where the Triton kernel tests run: on CPU tensors in the interpreter (the
default suite; Triton runs interpreted in a process without CUDA), and on a GPU
under the `gpu` marker."""

from __future__ import annotations

import pytest
import torch

# First: on a machine without CUDA, importing kernels.triton turns the interpreter
# on, which only works before triton itself is imported.
from kernels.triton import interpreted, triton_available


def _skip_reason(device: str) -> str | None:
    if not triton_available():
        return "triton is not installed"
    if device == "cpu":
        return None if interpreted() else "Triton is compiled for the GPU in this process"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return "TRITON_INTERPRET=1: kernels run interpreted" if interpreted() else None


DEVICES = [
    pytest.param("cpu", id="interpreted"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


@pytest.fixture(params=DEVICES)
def triton_device(request) -> torch.device:
    """Each test that takes it runs interpreted on CPU and, under `gpu`, on CUDA."""
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    return torch.device(request.param)


def gpu_only(device: torch.device) -> None:
    """Skip a case too slow or impossible in the interpreter (bf16 dots aside,
    which the kernels upcast there)."""
    if device.type != "cuda":
        pytest.skip("GPU-sized case")
