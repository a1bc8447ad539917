"""glibc malloc settings that keep a step's large buffers mapped between steps.

Torch's CPU allocator is plain malloc. A prefill step allocates activations of
several MB each (gate_up alone is 25 MB at 4096 tokens) and frees them again;
glibc hands blocks that large to mmap and gives freed heap tops back to the
OS, so every step faults its activations in anew, page by page. Under a
hypervisor a first touch is slow: a 4096-token prefill took about 76,000
minor faults, and the offline `prefill` benchmark ran 25% faster (4.6-5.5 s
against 6.2-7.2 s, interleaved runs on a 2-core VM) once malloc kept the
memory. vLLM's CPU build gets the same from tcmalloc in LD_PRELOAD; these are
malloc's own knobs, set at start-up, so nothing has to be preloaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from shared import env
from shared.logging import get_logger

logger = get_logger(__name__)

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# The largest mmap threshold glibc accepts on 64-bit (4 * 1024 * 1024 * sizeof(long)):
# anything larger, e.g. a KV pool, still gets its own mapping.
_MMAP_THRESHOLD = 32 * 2**20
# Freed memory returns to the OS only once this much is free at the heap top.
_TRIM_THRESHOLD = 4 * 2**30
# Grow the heap in big steps: fewer brk calls and fresh pages per step.
_TOP_PAD = 256 * 2**20


def keep_freed_memory() -> bool:
    """Apply the settings; False where this is not glibc or they are turned off
    (PAGODA_CPU_MALLOC_TUNING=0)."""
    if not env.cpu_malloc_tuning():
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # musl, macOS: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
            (_M_TOP_PAD, _TOP_PAD),
        )
    )
    if not ok:
        logger.warning("mallopt refused a setting: step buffers may be faulted in every step")
    return ok
