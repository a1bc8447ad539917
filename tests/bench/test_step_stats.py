"""KV figures over steps, on hand-made engine stats."""

from __future__ import annotations

import pytest

from bench.step_stats import StepStatsRecorder
from worker.stats import SchedulerStats


def stats(step, used, allocated, held, queries=0, hits=0, preemptions=0) -> SchedulerStats:
    return SchedulerStats(
        step=step,
        num_running=1,
        num_waiting=0,
        num_scheduled_tokens=1,
        num_kv_blocks_total=100,
        num_kv_blocks_used=used,
        num_kv_blocks_cached_free=0,
        kv_slots_allocated=allocated,
        kv_tokens_held=held,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        num_preemptions=preemptions,
    )


def test_waste_is_empty_slots_over_allocated_slots_summed_over_steps():
    before = stats(9, 0, 0, 0, queries=40, hits=8, preemptions=1)
    recorder = StepStatsRecorder(before)
    for s in [
        stats(10, 2, 8, 8, queries=48, hits=8),
        stats(11, 3, 12, 9, queries=48, hits=8, preemptions=3),
        stats(12, 5, 20, 10, queries=60, hits=14, preemptions=3),
    ]:
        recorder(s)
    figures = recorder.figures()
    assert figures.num_steps == 3
    assert figures.kv_waste == pytest.approx((0 + 3 + 10) / (8 + 12 + 20))
    assert (figures.peak_kv_blocks, figures.peak_kv_use) == (5, 0.05)
    # Counters are cumulative in the engine: only this run's part counts.
    assert (figures.prefix_cache_queries, figures.prefix_cache_hits) == (20, 6)
    assert figures.prefix_cache_hit_rate == pytest.approx(0.3)
    assert figures.num_preemptions == 2


def test_no_queries_means_no_hit_rate_and_no_steps_is_an_error():
    recorder = StepStatsRecorder()
    with pytest.raises(RuntimeError):
        recorder.figures()
    recorder(stats(1, 0, 0, 0))
    figures = recorder.figures()
    assert figures.prefix_cache_hit_rate is None and figures.kv_waste is None
