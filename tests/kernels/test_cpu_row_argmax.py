"""The greedy pick's kernel: each float32 or bf16 row's first maximum, as torch's argmax."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels
from worker.sample.sampler import row_argmax

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="the C++ kernels did not build here")


@pytest.mark.parametrize("n", [1, 5, 16, 31, 32, 33, 1000, 49152])
def test_random_rows_match_torch(n):
    x = torch.randn(37, n, generator=torch.Generator().manual_seed(n))
    assert torch.equal(kernels.row_argmax(x), x.argmax(dim=-1))


@pytest.mark.parametrize("n", [1, 17, 49152])
def test_bf16_rows_match_their_float32_copy(n):
    # bf16 has few distinct values: many rows tie, and the first maximum must win.
    x = torch.randn(9, n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    x[1, n // 2] = float("nan")
    assert torch.equal(kernels.row_argmax(x), kernels.row_argmax(x.float()))
    assert torch.equal(kernels.row_argmax(x), x.float().max(dim=-1).indices)


def test_ties_go_to_the_first_index():
    x = torch.zeros(4, 100)
    x[0, [7, 3, 90]] = 2.0  # three equal maxima: 3 is first
    x[1, [40, 41]] = 1.0  # two neighbours in one vector
    x[2, [17, 33, 49, 65]] = 5.0  # the same lane, four strides apart
    x[3] = -float("inf")  # nothing greater than the first
    assert kernels.row_argmax(x).tolist() == [3, 40, 17, 0]


def test_a_nan_wins_like_torch():
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(0))
    x[0, 150] = float("nan")
    x[1, [199, 60]] = float("nan")
    x[2, 0] = float("nan")
    assert kernels.row_argmax(x).tolist() == [150, 60, 0]
    assert kernels.row_argmax(x).tolist() == x.max(dim=-1).indices.tolist()


def test_strided_rows_and_the_sampler_entry():
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))[:, :250]  # rows 300 apart
    assert torch.equal(kernels.row_argmax(x), x.argmax(dim=-1))
    assert torch.equal(row_argmax(x.T.contiguous().T), x.argmax(dim=-1))  # column-major input


def test_other_inputs_are_refused():
    with pytest.raises(RuntimeError, match="float32 or bf16 rows"):
        kernels.row_argmax(torch.zeros(2, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="empty rows"):
        kernels.row_argmax(torch.zeros(2, 0))
