"""Keeps Redis true about this worker, from a thread of its own (schema: shared/registry.py).

Heartbeats (registration + load) go out every HEARTBEAT_FRACTION of the TTL.
Prefix-cache events from the engine thread are only appended to a deque
there; this thread folds everything that arrived since its last write into
one pipelined round trip, so Redis sees at most one write per engine step and
a slow or dead Redis never slows a step.

The thread keeps its own copy of the hashes the cache holds. Whenever Redis
may have missed changes (an error, a restart, an expired key) it rewrites the
whole set from that copy, so what Redis says converges on the truth. While
Redis is unreachable the worker serves on; this thread retries with backoff.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import redis

from shared.block_hash import BlockHash
from shared.logging import get_logger
from shared.registry import (
    RegistryKeys,
    WorkerInfo,
    WorkerLoad,
    deregister,
    make_client,
    queue_heartbeat,
    queue_ownership_changes,
    queue_ownership_rewrite,
)
from worker.kv_cache.block_pool import BlockStored, KVCacheEvent

logger = get_logger(__name__)

HEARTBEAT_FRACTION = 1 / 3  # of the TTL: two beats may be lost before the key expires
MAX_HEARTBEAT_INTERVAL_S = 1.0  # load goes out at least this often
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.1, 5.0


class RegistryPublisher:
    def __init__(
        self,
        url: str,
        keys: RegistryKeys,
        info: WorkerInfo,
        load: Callable[[], WorkerLoad],
        ttl_s: float,
    ) -> None:
        self._client = make_client(url, timeout_s=min(2.0, ttl_s / 2))
        self._url = url
        self._keys = keys
        self.info = info
        self._load = load
        self._ttl_ms = max(int(ttl_s * 1000), 1)
        self._interval_s = min(ttl_s * HEARTBEAT_FRACTION, MAX_HEARTBEAT_INTERVAL_S)
        self._events: deque[KVCacheEvent] = deque()
        self._held: set[BlockHash] = set()
        self._is_synced = True  # Redis holds exactly self._held (nothing, at start)
        self._is_failing = False
        self._next_beat = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pagoda-redis", daemon=True)
        self.num_writes = 0  # round trips that succeeded; for tests and logs

    def start(self) -> None:
        self._thread.start()

    def submit(self, events: Sequence[KVCacheEvent]) -> None:
        """Called by the engine thread after a step: no I/O, no lock beyond the wake-up."""
        self._events.extend(events)
        self._wake.set()

    def beat_now(self) -> None:
        """Publish at once (e.g. load changed meaning: draining)."""
        self._next_beat = 0.0
        self._wake.set()

    def stop(self, leave: bool = True) -> None:
        """Stop the thread; with `leave`, remove every key of this worker."""
        self._stop.set()
        self._wake.set()
        if self._thread.ident is None:  # never started: nothing was written
            leave = False
        else:
            self._thread.join(timeout=10)
        if leave:
            try:
                deregister(self._client, self._keys, self.info)
                logger.info("left the Redis registry (%s)", self.info.worker_id)
            except redis.RedisError as exc:
                logger.warning(
                    "could not deregister from Redis (keys expire on their own): %s", exc
                )
        self._client.close()

    # ---- the publisher thread ---------------------------------------------------------

    def _run(self) -> None:
        backoff = MIN_BACKOFF_S
        while not self._stop.is_set():
            self._wake.wait(max(self._next_beat - time.monotonic(), 0))
            self._wake.clear()
            if self._stop.is_set():
                break
            added, removed = self._apply_events()
            try:
                self._write(added, removed)
            except (redis.RedisError, OSError) as exc:
                self._is_synced = False
                if not self._is_failing:
                    logger.warning(
                        "Redis at %s is unreachable (%s); serving on, retrying with backoff",
                        self._url,
                        exc,
                    )
                self._is_failing = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                self._wake.set()  # retry (and re-register) without waiting for the next beat
                continue
            backoff = MIN_BACKOFF_S
            if self._is_failing:
                logger.info("Redis at %s is back; registered again", self._url)
                self._is_failing = False

    def _apply_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Fold the pending cache events into the local copy; return the net change."""
        touched: set[BlockHash] = set()
        while self._events:
            event = self._events.popleft()
            if isinstance(event, BlockStored):
                self._held.add(event.block_hash)
            else:
                self._held.discard(event.block_hash)
            touched.add(event.block_hash)
        added = [h for h in touched if h in self._held]
        removed = [h for h in touched if h not in self._held]
        return added, removed

    def _write(self, added: list[BlockHash], removed: list[BlockHash]) -> None:
        is_beat = time.monotonic() >= self._next_beat
        if not (is_beat or added or removed or not self._is_synced):
            return
        pipe = self._client.pipeline(transaction=False)
        if is_beat:
            check = queue_heartbeat(pipe, self._keys, self.info, self._load(), self._ttl_ms)
        if not self._is_synced:
            queue_ownership_rewrite(pipe, self._keys, self.info, self._held, self._ttl_ms)
        elif added or removed:
            queue_ownership_changes(pipe, self._keys, self.info, added, removed, self._ttl_ms)
        results = pipe.execute()
        self.num_writes += 1
        if is_beat:
            self._next_beat = time.monotonic() + self._interval_s
            # Did the ownership set still exist? If not (expired, or Redis lost its
            # data), Redis missed changes: rewrite it.
            if self._is_synced and not results[check] and self._held:
                self._is_synced = False
                self._wake.set()
                return
        self._is_synced = True
