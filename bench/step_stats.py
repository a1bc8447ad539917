"""KV-cache figures integrated over engine steps, from the engine's `SchedulerStats`.

`StepStatsRecorder` is the `on_step` callback of `LLM.generate`. Per step, after the
step's tokens are computed and finished requests are freed, the engine reports:

    kv_slots_allocated   slots in the blocks each running request holds
    kv_tokens_held       of those, slots holding a computed token

    per request:  | computed tokens ........ | empty slots |
                  '--- kv_tokens_held ------' '-- waste ---'
                  '------------ kv_slots_allocated --------'

KV waste = sum over steps (allocated - held) / sum over steps allocated: the share
of reserved KV memory, weighted by how long it was reserved, that held no token.
It counts the unfilled tail of each request's last block (internal fragmentation)
and any slots allocated ahead of the tokens that fill them. Blocks shared through
the prefix cache count once per request holding them, on both sides of the ratio.
Cumulative engine counters (prefix-cache queries and hits, preemptions) are taken
as differences from the first step seen, so a warm-up before does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.stats import SchedulerStats


@dataclass(frozen=True)
class KVFigures:
    num_steps: int
    peak_kv_blocks: int
    peak_kv_use: float  # of all KV blocks
    kv_waste: float | None  # None when nothing was ever allocated
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int
    num_preemptions: int

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        if self.prefix_cache_queries == 0:  # caching off
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


class StepStatsRecorder:
    def __init__(self, before: SchedulerStats | None = None) -> None:
        """`before`: the engine's last stats before this run (its counters are the
        zero point); None for a fresh engine."""
        self._before = before
        self._last: SchedulerStats | None = None
        self.num_steps = 0
        self.peak_kv_blocks = 0
        self.peak_kv_use = 0.0
        self.sum_slots_allocated = 0
        self.sum_tokens_held = 0

    def __call__(self, stats: SchedulerStats) -> None:
        self.num_steps += 1
        self._last = stats
        if stats.num_kv_blocks_used > self.peak_kv_blocks:
            self.peak_kv_blocks = stats.num_kv_blocks_used
            self.peak_kv_use = stats.kv_usage
        self.sum_slots_allocated += stats.kv_slots_allocated
        self.sum_tokens_held += stats.kv_tokens_held

    def figures(self) -> KVFigures:
        last = self._last
        if last is None:
            raise RuntimeError("no engine step was recorded")
        before = self._before
        allocated = self.sum_slots_allocated
        return KVFigures(
            num_steps=self.num_steps,
            peak_kv_blocks=self.peak_kv_blocks,
            peak_kv_use=self.peak_kv_use,
            kv_waste=(allocated - self.sum_tokens_held) / allocated if allocated else None,
            prefix_cache_queries=last.prefix_cache_queries
            - (before.prefix_cache_queries if before else 0),
            prefix_cache_hits=last.prefix_cache_hits - (before.prefix_cache_hits if before else 0),
            num_preemptions=last.num_preemptions - (before.num_preemptions if before else 0),
        )
