"""The Redis key schema that workers write and routers read (docs/REDIS.md).

```
{prefix}:workers                   ZSET  worker id -> heartbeat deadline (ms since the Unix epoch)
{prefix}:worker:{id}               HASH  WorkerInfo (address, model, block size, epoch, ...)   TTL
{prefix}:worker:{id}:load          HASH  WorkerLoad (running, waiting, KV use, token rates)    TTL
{prefix}:owned:{id}:{epoch}        SET   16-byte block hashes the worker's prefix cache holds  TTL
```

Every key a worker writes expires unless its heartbeat refreshes it, so a
worker that dies vanishes on its own. The epoch changes on every start and is
part of the ownership key, so records of a previous life of the same worker id
are never read as current. A worker's ownership set is one key, so a router
answers "how much of this prompt does each live worker hold" with one
SMISMEMBER per worker, all in one pipelined round trip.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis

from shared.block_hash import BLOCK_HASH_SCHEME, BlockHash, block_hashes

DEFAULT_PREFIX = "pagoda"
# SADD arguments per command when a whole ownership set is rewritten.
_CHUNK = 4096


def now_ms() -> int:
    return int(time.time() * 1000)


def make_client(url: str, timeout_s: float = 2.0) -> redis.Redis:
    """A client that fails fast and never retries by itself: callers own the retry policy."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


@dataclass(frozen=True)
class RegistryKeys:
    prefix: str = DEFAULT_PREFIX

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def load(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}:load"

    def owned(self, worker_id: str, epoch: int) -> str:
        return f"{self.prefix}:owned:{worker_id}:{epoch}"


class _HashRecord:
    """A flat dataclass stored as a Redis hash: every field a string, parsed by its type."""

    def to_mapping(self) -> dict[str, str]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_mapping(cls, mapping: Mapping[bytes | str, bytes | str]):
        """Parse a hash read back from Redis; fields this version does not know are ignored,
        so old readers survive new writers."""
        text = {_text(k): _text(v) for k, v in mapping.items()}
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in text:
                values[f.name] = _decode(f.type, text[f.name])
        return cls(**values)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _encode(value: object) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def _decode(type_name: object, text: str) -> object:
    type_name = str(type_name)
    if type_name == "bool":
        return text not in ("0", "", "False")
    if type_name == "int":
        return int(text)
    if type_name == "float":
        return float(text)
    return text


@dataclass(frozen=True)
class WorkerInfo(_HashRecord):
    """What a worker announces once per start (and re-writes with each heartbeat)."""

    worker_id: str
    address: str  # host:port routers dial
    model: str  # served model name
    architecture: str = ""
    block_size: int = 16
    max_model_len: int = 0
    num_kv_blocks: int = 0
    kv_capacity_tokens: int = 0  # num_kv_blocks * block_size
    block_hash_scheme: str = BLOCK_HASH_SCHEME
    enable_prefix_caching: bool = True
    epoch: int = 0  # changes on every start; ownership records carry it
    started_at_ms: int = 0


@dataclass(frozen=True)
class WorkerLoad(_HashRecord):
    """How busy a worker is; the same numbers GetLoad returns."""

    num_running_requests: int = 0
    num_waiting_requests: int = 0
    num_queued_prefill_tokens: int = 0
    num_kv_blocks_used: int = 0
    num_kv_blocks_total: int = 0
    num_kv_blocks_cached: int = 0
    prefill_tokens_per_second: float = 0.0
    decode_tokens_per_second: float = 0.0
    num_active_streams: int = 0
    num_steps: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    is_draining: bool = False  # shutting down: refuses new requests
    updated_at_ms: int = 0


# ---- worker side: writes --------------------------------------------------------


def queue_heartbeat(
    pipe: redis.client.Pipeline,
    keys: RegistryKeys,
    info: WorkerInfo,
    load: WorkerLoad,
    ttl_ms: int,
) -> int:
    """Queue one heartbeat: (re-)register, publish load, keep the ownership set alive.

    Returns the index, in the pipeline's results, of a result that is 1 if the
    ownership set still exists and 0 if it is gone (expired, or Redis lost its
    data), in which case the worker must rewrite it.
    """
    now = now_ms()
    worker_key, load_key = keys.worker(info.worker_id), keys.load(info.worker_id)
    pipe.hset(worker_key, mapping=info.to_mapping())
    pipe.pexpire(worker_key, ttl_ms)
    pipe.hset(load_key, mapping=load.to_mapping())
    pipe.pexpire(load_key, ttl_ms)
    pipe.zadd(keys.workers, {info.worker_id: now + ttl_ms})
    # Dead workers' entries are dropped by whoever heartbeats next.
    pipe.zremrangebyscore(keys.workers, "-inf", now)
    pipe.pexpire(keys.owned(info.worker_id, info.epoch), ttl_ms)
    return len(pipe) - 1


def queue_ownership_changes(
    pipe: redis.client.Pipeline,
    keys: RegistryKeys,
    info: WorkerInfo,
    added: Sequence[BlockHash],
    removed: Sequence[BlockHash],
    ttl_ms: int,
) -> None:
    key = keys.owned(info.worker_id, info.epoch)
    if added:
        pipe.sadd(key, *added)
    if removed:
        pipe.srem(key, *removed)
    # NOTE: a set emptied by SREM is deleted, and a later SADD recreates it
    # without a TTL; the expiry is set again after every change for that reason.
    pipe.pexpire(key, ttl_ms)


def queue_ownership_rewrite(
    pipe: redis.client.Pipeline,
    keys: RegistryKeys,
    info: WorkerInfo,
    held: Iterable[BlockHash],
    ttl_ms: int,
) -> None:
    """Replace the whole ownership set, e.g. after Redis lost it or missed changes."""
    key = keys.owned(info.worker_id, info.epoch)
    pipe.delete(key)
    held = list(held)
    for start in range(0, len(held), _CHUNK):
        pipe.sadd(key, *held[start : start + _CHUNK])
    pipe.pexpire(key, ttl_ms)


def deregister(client: redis.Redis, keys: RegistryKeys, info: WorkerInfo) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.zrem(keys.workers, info.worker_id)
    pipe.delete(keys.worker(info.worker_id), keys.load(info.worker_id))
    pipe.delete(keys.owned(info.worker_id, info.epoch))
    pipe.execute()


# ---- router side: reads ---------------------------------------------------------


def live_workers(client: redis.Redis, keys: RegistryKeys) -> list[WorkerInfo]:
    """Workers whose heartbeat has not lapsed, in worker id order."""
    worker_ids = sorted(_text(w) for w in client.zrangebyscore(keys.workers, now_ms(), "+inf"))
    if not worker_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.hgetall(keys.worker(worker_id))
    # A key that expired after the ZSET read is simply absent.
    return [WorkerInfo.from_mapping(m) for m in pipe.execute() if m]


def worker_loads(
    client: redis.Redis, keys: RegistryKeys, worker_ids: Sequence[str]
) -> dict[str, WorkerLoad]:
    pipe = client.pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.hgetall(keys.load(worker_id))
    return {w: WorkerLoad.from_mapping(m) for w, m in zip(worker_ids, pipe.execute()) if m}


def prefix_match_blocks(
    client: redis.Redis,
    keys: RegistryKeys,
    workers: Sequence[WorkerInfo],
    token_ids: Sequence[int],
    cache_salt: bytes | None = None,
) -> dict[str, int]:
    """For each worker, how many leading full blocks of `token_ids` it holds, in one
    round trip.

    Hashes are computed per block size, with the shared block hash. Workers with
    prefix caching off or another hash scheme hold nothing comparable (0).
    NOTE: the count is the leading run of held blocks, because the engine's
    prefix lookup stops at the first block it lacks.
    """
    chains: dict[int, list[BlockHash]] = {}
    asked: list[tuple[WorkerInfo, list[BlockHash]]] = []
    for worker in workers:
        if not worker.enable_prefix_caching or worker.block_hash_scheme != BLOCK_HASH_SCHEME:
            continue
        if worker.block_size not in chains:
            chains[worker.block_size] = block_hashes(token_ids, worker.block_size, cache_salt)
        if chains[worker.block_size]:
            asked.append((worker, chains[worker.block_size]))
    result = {w.worker_id: 0 for w in workers}
    if not asked:
        return result
    pipe = client.pipeline(transaction=False)
    for worker, chain in asked:
        pipe.smismember(keys.owned(worker.worker_id, worker.epoch), chain)
    for (worker, _), held in zip(asked, pipe.execute()):
        result[worker.worker_id] = next((i for i, h in enumerate(held) if not h), len(held))
    return result
