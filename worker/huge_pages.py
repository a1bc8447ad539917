"""Anonymous memory advised for 2 MiB pages, for the big CPU buffers a step
streams through: the KV pools (worker/runner/kv_memory.py) and the packed bf16
weights (worker/layers/cpu_packed.py). With 4 KiB pages each of
them spans tens of thousands of pages, and every jump between scattered blocks,
or every page of a weight stream, costs a TLB miss.

MADV_HUGEPAGE gets 2 MiB pages wherever transparent huge pages are allowed (the
common `madvise` setting); pages fault in on first touch.
"""

from __future__ import annotations

import mmap

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
