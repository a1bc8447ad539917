"""Allocation of the KV pools, backed by huge pages on CPU.

The decode kernel jumps between scattered blocks; with 4 KiB pages every jump
is a TLB miss and a prefetcher restart. An anonymous mapping advised with
MADV_HUGEPAGE gets 2 MiB pages wherever transparent huge pages are allowed
(the common `madvise` setting), and is zero-filled by the kernel for free.
"""

from __future__ import annotations

import mmap

import torch

_HUGE_PAGE = 2 * 2**20


def allocate_kv_pool(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zeroed tensor of `shape`; on CPU, in huge pages when the OS allows."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = torch.Size(shape).numel() * _element_size(dtype)
    if num_bytes < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    size = -(-num_bytes // _HUGE_PAGE) * _HUGE_PAGE
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    # The tensor keeps `region` alive through the buffer protocol.
    return torch.frombuffer(region, dtype=dtype, count=num_bytes // _element_size(dtype)).view(
        shape
    )


def _element_size(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()
