"""Anonymous memory advised for 2 MiB pages, for the big CPU buffers a step
streams through: the KV pools (worker/runner/kv_memory.py) and the packed
weights, bf16 panels (worker/layers/cpu_packed.py) and the AVX2 half panels
(worker/layers/cpu_half_f32.py), side by side in one arena (place_weight). With
4 KiB pages each of them spans tens of thousands of pages, and every jump
between scattered blocks, or every page of a weight stream, costs a TLB miss.

MADV_HUGEPAGE gets 2 MiB pages wherever transparent huge pages are allowed (the
common `madvise` setting); pages fault in on first touch.
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 * 2**20


def huge_page_mapping(num_bytes: int) -> mmap.mmap | None:
    """A private anonymous mapping of at least `num_bytes`, a whole number of huge
    pages, advised MADV_HUGEPAGE; None where this Python or OS has no such advice."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    size = -(-num_bytes // HUGE_PAGE) * HUGE_PAGE
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    return region


class HugePageArena:
    """Packed weights side by side in huge pages. A decode step streams every
    layer's weights: 30 layers of SmolLM2 bf16 panels at 32 rows took 12.0 ms in
    4 KiB pages, 11.1 ms in huge pages (AVX512-BF16); the AVX2 half panels at one
    row through the GEMV 9.40 -> 8.87 ms (medians, Zen 3, 2 threads). Pages fault
    in as weights are copied in, so untouched tail space costs nothing."""

    _CHUNK = 64 * 2**20
    _ALIGN = 64

    def __init__(self) -> None:
        self.region: mmap.mmap | None = None
        self.used = 0

    def place(self, packed: torch.Tensor) -> torch.Tensor:
        """A copy of `packed` in the arena (the same tensor where the OS has no
        huge-page advice)."""
        num_bytes = packed.numel() * packed.element_size()
        if self.region is None or self.used + num_bytes > len(self.region):
            region = huge_page_mapping(max(self._CHUNK, num_bytes))
            if region is None:
                return packed
            self.region, self.used = region, 0
        # The view keeps its region alive through the buffer protocol.
        raw = torch.frombuffer(self.region, dtype=torch.uint8, count=num_bytes, offset=self.used)
        self.used += -(-num_bytes // self._ALIGN) * self._ALIGN
        return raw.view(packed.dtype).view(packed.shape).copy_(packed)


_weights = HugePageArena()


def place_weight(packed: torch.Tensor) -> torch.Tensor:
    """`packed` copied into the process's weight arena (itself where the OS has no
    huge-page advice)."""
    return _weights.place(packed)
