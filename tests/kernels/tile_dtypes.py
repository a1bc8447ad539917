"""The dtypes the attention tiles (prefill and cascade prefix) are tested in here,
and how close each comes to the plain-PyTorch twin."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels

kernels = load_cpu_kernels()
TILE_DTYPES = [
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(
            kernels is None or not kernels.prefill_supported(64),
            reason="the bf16 tiles need a CPU with AMX or AVX512-BF16",
        ),
    ),
    torch.float32,
]
# bf16 rounds probabilities before P @ V; float32 differs from the twin only in
# summation order and exp's polynomial.
TILE_TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 2e-5}
