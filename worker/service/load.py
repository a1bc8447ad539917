"""How busy the worker is: per-step numbers from the engine thread, snapshots for
GetLoad and the Redis heartbeat."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque

from shared.registry import WorkerLoad, now_ms
from worker.scheduler.scheduler import Scheduler
from worker.stats import SchedulerStats

# Token rates are "tokens in the last RATE_WINDOW_S seconds / RATE_WINDOW_S", so
# they decay to zero on their own once the worker goes idle.
RATE_WINDOW_S = 5.0


def queued_prefill_tokens(scheduler: Scheduler) -> int:
    """Prompt (and recompute) tokens that still have to run through the model.

    A decoding request has exactly one uncomputed token (the one it sampled
    last): that one is decode work, not prefill.
    """
    total = 0
    for request in scheduler.requests.values():
        pending = request.num_tokens - request.num_computed_tokens
        if request.output_token_ids:
            pending -= 1
        total += max(pending, 0)
    return total


class LoadTracker:
    """Written once per step by the engine thread, read by any thread."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self._window_s = window_s
        self._lock = threading.Lock()
        # (monotonic time, prefill tokens, decode tokens) per step within the window
        self._steps: deque[tuple[float, int, int]] = deque()
        self._latest = WorkerLoad()
        # Maintained by the event loop; plain values, read without a lock.
        self.num_active_streams = 0
        self.is_draining = False

    def record_step(
        self, stats: SchedulerStats, num_output_tokens: int, num_queued_prefill: int
    ) -> None:
        # Scheduled tokens that produced no output token were prompt work.
        num_prefill = max(stats.num_scheduled_tokens - num_output_tokens, 0)
        latest = WorkerLoad(
            num_running_requests=stats.num_running,
            num_waiting_requests=stats.num_waiting,
            num_queued_prefill_tokens=num_queued_prefill,
            num_kv_blocks_used=stats.num_kv_blocks_used,
            num_kv_blocks_total=stats.num_kv_blocks_total,
            num_kv_blocks_cached=stats.num_kv_blocks_cached_free,
            num_steps=stats.step,
            num_preemptions=stats.num_preemptions,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
        )
        now = time.monotonic()
        with self._lock:
            self._steps.append((now, num_prefill, num_output_tokens))
            self._prune(now)
            self._latest = latest

    def _prune(self, now: float) -> None:
        while self._steps and self._steps[0][0] < now - self._window_s:
            self._steps.popleft()

    def snapshot(self) -> WorkerLoad:
        with self._lock:
            self._prune(time.monotonic())
            prefill = sum(s[1] for s in self._steps)
            decode = sum(s[2] for s in self._steps)
            latest = self._latest
        return dataclasses.replace(
            latest,
            prefill_tokens_per_second=prefill / self._window_s,
            decode_tokens_per_second=decode / self._window_s,
            num_active_streams=self.num_active_streams,
            is_draining=self.is_draining,
            updated_at_ms=now_ms(),
        )
