"""The affinity store in Redis: workers' ownership sets plus routers' choice records.

Beside the keys workers write (shared/registry.py), routers write one:

```
{prefix}:chosen:{id}:{epoch}   ZSET  block hash -> expiry (ms since the Unix epoch)   TTL
```

A sorted set, because every member needs an expiry of its own. The routing
query is one pipelined round trip: per live worker, SMISMEMBER on its
ownership set and ZMSCORE on its choice set, over the prompt's block hashes.
A block counts as held when either says so.

When Redis fails, the store says so once (log, `is_available`) and answers
StoreUnavailable at once, with no I/O, until `probe()` (the router's refresh
loop, every second) finds it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from router.routing.store import (
    AffinityStore,
    PromptHashes,
    StoreUnavailable,
    WorkerKey,
    leading_run,
)
from shared.block_hash import BlockHash
from shared.logging import get_logger
from shared.registry import RegistryKeys, WorkerInfo, live_workers, now_ms

logger = get_logger(__name__)

# A routing query waits this long at most before routing on load alone.
QUERY_TIMEOUT_S = 0.5
_ERRORS = (redis.RedisError, OSError, asyncio.TimeoutError)


@dataclass(frozen=True)
class RouterKeys(RegistryKeys):
    def chosen(self, worker_id: str, epoch: int) -> str:
        return f"{self.prefix}:chosen:{worker_id}:{epoch}"


class RedisStore(AffinityStore):
    name = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.keys = RouterKeys(prefix)
        # NOTE: one immediate retry on a broken connection, none on a timeout: after a
        # Redis restart every pooled connection is dead, and each would otherwise fail
        # one query (and mark Redis down again) before being replaced.
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=QUERY_TIMEOUT_S,
            socket_connect_timeout=QUERY_TIMEOUT_S,
            retry=AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        )
        # The registry is read with the shared, synchronous reader, in a thread, once
        # per refresh, never on a request's path.
        self._sync_client = redis.Redis.from_url(
            url,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        )
        self._is_available = True

    @property
    def is_available(self) -> bool:
        return self._is_available

    @property
    def has_registry(self) -> bool:
        return True

    def _failed(self, exc: BaseException) -> StoreUnavailable:
        if self._is_available:
            logger.warning(
                "Redis at %s is unreachable (%s): routing on load alone until it is back",
                self.url,
                exc or type(exc).__name__,
            )
        self._is_available = False
        return StoreUnavailable(str(exc))

    async def match(self, workers: Sequence[WorkerKey], prompt: PromptHashes) -> dict[str, int]:
        if not self._is_available:
            raise StoreUnavailable(f"Redis at {self.url} is unreachable")
        result = {w.worker_id: 0 for w in workers}
        asked = [(w, prompt.chain(w.block_size)) for w in workers if w.has_prefix_cache]
        asked = [(w, chain) for w, chain in asked if chain]
        if not asked:
            return result
        pipe = self._client.pipeline(transaction=False)
        for worker, chain in asked:
            pipe.smismember(self.keys.owned(worker.worker_id, worker.epoch), chain)
            pipe.zmscore(self.keys.chosen(worker.worker_id, worker.epoch), chain)
        try:
            replies = await pipe.execute()
        except _ERRORS as exc:
            raise self._failed(exc) from exc
        now = now_ms()
        for i, (worker, _) in enumerate(asked):
            owned, chosen = replies[2 * i], replies[2 * i + 1]
            held = [bool(o) or (c is not None and c > now) for o, c in zip(owned, chosen)]
            result[worker.worker_id] = leading_run(held)
        return result

    async def record(self, worker: WorkerKey, hashes: Sequence[BlockHash], ttl_s: float) -> None:
        if not self._is_available or not hashes or not worker.has_prefix_cache:
            return
        now, ttl_ms = now_ms(), int(ttl_s * 1000)
        key = self.keys.chosen(worker.worker_id, worker.epoch)
        pipe = self._client.pipeline(transaction=False)
        pipe.zadd(key, dict.fromkeys(hashes, now + ttl_ms))
        pipe.zremrangebyscore(key, "-inf", now)  # lapsed choices of this worker
        pipe.pexpire(key, ttl_ms)
        try:
            await pipe.execute()
        except _ERRORS as exc:
            self._failed(exc)

    async def live_workers(self) -> list[WorkerInfo]:
        try:
            return await asyncio.to_thread(live_workers, self._sync_client, self.keys)
        except _ERRORS as exc:
            raise self._failed(exc) from exc

    async def probe(self) -> bool:
        try:
            await self._client.ping()
        except _ERRORS:
            return False
        if not self._is_available:
            logger.info("Redis at %s is back: routing by prefix affinity again", self.url)
        self._is_available = True
        return True

    async def close(self) -> None:
        await self._client.aclose()
        self._sync_client.close()
