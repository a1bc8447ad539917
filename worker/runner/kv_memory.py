"""Allocation of the KV pools, backed by huge pages on CPU, resident from start-up.

The decode kernel jumps between scattered blocks; with 4 KiB pages every jump
is a TLB miss and a prefetcher restart, so the pools live in huge pages
(worker/huge_pages.py).

The pages are faulted in here, not on first use: the block pool hands blocks
out in LRU order, so a lazily mapped pool keeps touching new pages for as long
as it runs, and each first touch (zeroing a huge page, under a hypervisor
often a host fault too) lands inside a request's step. Measured on a 2-core VM:
first writes to fresh huge pages ran at 0.5 GB/s, 7% of a 4096-token prefill
step. vLLM's CPU pool is resident from start-up too (torch.zeros).
"""

from __future__ import annotations

import mmap

import torch

from worker.attention.backends.base import HALF_KV_DTYPES
from worker.huge_pages import HUGE_PAGE, huge_page_mapping

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


_KV_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
}


def kv_cache_dtype(
    name: str, model_dtype: torch.dtype, widened_from: torch.dtype | None = None
) -> torch.dtype:
    """--kv-cache-dtype as a torch dtype. auto: the model's, except where the model
    computes in float32 a checkpoint stored in a half dtype (`widened_from`: a CPU
    without native bf16 under --dtype auto, worker/runner/platform.py): K/V stay in
    that half dtype, as the linear weights do (worker/layers/cpu_half_f32.py): half
    the bytes decode attention reads each step and twice the tokens in the same
    memory; each K/V value is rounded once, as transformers' model in the
    checkpoint's dtype rounds it."""
    if name != "auto":
        return _KV_DTYPES[name]
    if model_dtype == torch.float32 and widened_from in HALF_KV_DTYPES:
        return widened_from
    return model_dtype


def allocate_kv_pool(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zeroed tensor of `shape`; on CPU, in huge pages when the OS allows."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = torch.Size(shape).numel() * _element_size(dtype)
    region = huge_page_mapping(num_bytes) if num_bytes >= HUGE_PAGE else None
    if region is None:
        return torch.zeros(shape, dtype=dtype)
    # The tensor keeps `region` alive through the buffer protocol.
    pool = torch.frombuffer(region, dtype=dtype, count=num_bytes // _element_size(dtype))
    try:
        region.madvise(_MADV_POPULATE_WRITE)  # the kernel faults every page in, in one call
    except OSError:  # Linux before 5.14: touch the pages ourselves
        pool.zero_()
    return pool.view(shape)


def _element_size(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()
