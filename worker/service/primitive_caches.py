"""Bounds on oneDNN's caches of compiled kernels, so a worker's memory stays flat.

Torch runs CPU linears (float32 and bfloat16) through oneDNN, which compiles a
kernel for each shape it meets and keeps it in two caches: oneDNN's own
primitive cache and ideep's (torch's oneDNN wrapper) LRU cache, 1,024 entries
each by default. A serving worker meets a new shape with almost every new
batch token count, so both fill for hours: in the soak a worker's RSS grew
493 -> 596 -> 760 MB at 5 / 15 / 30 minutes while Python's own memory stayed
flat (tracemalloc). In isolation, bfloat16 linears over 995 token counts grew
malloc's in-use memory by 526 MB at the defaults and by 2 MB with both caches at
8 entries; a steady run of the same shapes grows nothing (a cache, not a leak).

256 entries each holds the shapes a worker meets again and again (decode batch
sizes change a little per step; prefill chunk sizes are mostly new anyway), and
bounds the caches to a fraction of what the defaults let them take. A miss costs
one kernel build: 0.27 ms per linear call on a 2048 x 1024 bf16 weight, measured
with 8 entries against 1,024 on a rotation of 64 shapes (CPU time).

Set before the first oneDNN call, which reads them (torch's import does not);
values already in the environment win, and child processes (tensor-parallel
ranks) inherit them.
"""

from __future__ import annotations

import os

# oneDNN's primitive cache and ideep's, by the environment variables they read.
CAPACITY_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
DEFAULT_CAPACITY = 256


def bound_primitive_caches(capacity: int = DEFAULT_CAPACITY) -> dict[str, str]:
    """Set each cache's capacity unless the environment sets it; return what holds."""
    for name in CAPACITY_VARIABLES:
        os.environ.setdefault(name, str(capacity))
    return {name: os.environ[name] for name in CAPACITY_VARIABLES}
