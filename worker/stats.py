"""Engine statistics, one snapshot per step, ready to become metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerStats:
    step: int
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    num_kv_blocks_total: int
    num_kv_blocks_used: int  # held by at least one request
    num_kv_blocks_cached_free: int  # unreferenced but still holding a cached prefix
    kv_slots_allocated: int  # slots in blocks held by running requests
    kv_tokens_held: int  # of those, slots holding a computed token
    # Cumulative since start:
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # of those, served from the cache
    num_preemptions: int

    @property
    def num_kv_blocks_free(self) -> int:
        return self.num_kv_blocks_total - self.num_kv_blocks_used

    @property
    def kv_usage(self) -> float:
        return self.num_kv_blocks_used / max(self.num_kv_blocks_total, 1)
