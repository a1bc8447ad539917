from __future__ import annotations

import pytest
import torch

from worker.config import ModelConfig
from worker.runner import platform


class Spec:
    def __init__(self, dtype: torch.dtype) -> None:
        self.checkpoint_dtype = dtype


@pytest.mark.parametrize(
    "checkpoint, fast_bf16, expected",
    [
        (torch.bfloat16, True, torch.bfloat16),
        (torch.bfloat16, False, torch.float32),
        (torch.float16, True, torch.bfloat16),
        (torch.float32, True, torch.float32),
    ],
)
def test_auto_dtype_on_cpu(monkeypatch, checkpoint, fast_bf16, expected):
    monkeypatch.setattr(platform, "cpu_has_fast_bf16", lambda: fast_bf16)
    got = platform.resolve_dtype(ModelConfig(model="m"), Spec(checkpoint), torch.device("cpu"))
    assert got == expected


@pytest.mark.parametrize(
    "checkpoint, expected",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.bfloat16),
    ],
)
def test_auto_dtype_on_gpu(checkpoint, expected):
    got = platform.resolve_dtype(ModelConfig(model="m"), Spec(checkpoint), torch.device("cuda"))
    assert got == expected


def test_explicit_dtype_wins():
    config = ModelConfig(model="m", dtype="float16")
    assert platform.resolve_dtype(config, Spec(torch.float32), torch.device("cpu")) == torch.float16


@pytest.mark.parametrize(
    "dtype, fast_bf16, warned",
    [("bfloat16", False, True), ("bfloat16", True, False), ("float32", False, False)],
)
def test_half_precision_on_a_cpu_without_bf16_is_warned_about(
    monkeypatch, dtype, fast_bf16, warned
):
    warnings = []
    monkeypatch.setattr(platform, "cpu_has_fast_bf16", lambda: fast_bf16)
    monkeypatch.setattr(platform.logger, "warning", lambda msg, *args: warnings.append(msg % args))
    config = ModelConfig(model="m", dtype=dtype)
    assert platform.resolve_dtype(config, Spec(torch.bfloat16), torch.device("cpu")) == getattr(
        torch, dtype
    )
    assert bool(warnings) == warned
    if warned:
        assert warnings[0].startswith("--dtype bfloat16 on a CPU without native bf16 arithmetic")
