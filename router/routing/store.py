"""Where routers find who holds which prompt prefix, and record their own choices.

Two kinds: `RedisStore` (routing/redis_store.py), shared by every router and
fed by the workers' own ownership records, and `LocalStore` here, in the
router's memory, for a router without Redis (`pagoda serve` on a bare
machine): there, the router's choices are all it knows.

A choice record says "worker W was just sent a prompt starting with these
blocks": it lets a second request with the same prefix follow at once,
before (or without) the worker's own records.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from shared.block_hash import BlockHash, block_hashes
from shared.registry import WorkerInfo


class StoreUnavailable(Exception):
    """The store cannot answer now; the router routes on load alone meanwhile."""


@dataclass(frozen=True)
class WorkerKey:
    """What a store needs to know of a worker."""

    worker_id: str
    epoch: int
    block_size: int
    has_prefix_cache: bool = True  # prefix caching on, with our block hash scheme


class PromptHashes:
    """A prompt's chained block hashes, computed once per block size."""

    def __init__(self, token_ids: Sequence[int], cache_salt: bytes | None = None) -> None:
        self.token_ids = token_ids
        self.cache_salt = cache_salt
        self._chains: dict[int, list[BlockHash]] = {}

    def chain(self, block_size: int) -> list[BlockHash]:
        if block_size not in self._chains:
            self._chains[block_size] = block_hashes(self.token_ids, block_size, self.cache_salt)
        return self._chains[block_size]


def leading_run(flags: Sequence[bool]) -> int:
    """How many flags are true before the first false one: the engine's prefix lookup
    stops at the first block it lacks, so only the leading run counts."""
    return next((i for i, flag in enumerate(flags) if not flag), len(flags))


class AffinityStore(ABC):
    # Said in logs and metrics.
    name: str = "store"

    @property
    def is_available(self) -> bool:
        return True

    @property
    def has_registry(self) -> bool:
        """Whether workers announce themselves here (else the router has a static list)."""
        return False

    @abstractmethod
    async def match(self, workers: Sequence[WorkerKey], prompt: PromptHashes) -> dict[str, int]:
        """For each worker id, how many leading full blocks of the prompt it likely holds.
        Raises StoreUnavailable when the store cannot answer."""

    @abstractmethod
    async def record(self, worker: WorkerKey, hashes: Sequence[BlockHash], ttl_s: float) -> None:
        """Note that `worker` holds (or is about to hold) these blocks, for `ttl_s`."""

    async def live_workers(self) -> list[WorkerInfo]:
        """The workers registered here (only when has_registry)."""
        return []

    async def probe(self) -> bool:
        """Check the store answers again; True when it does."""
        return True

    async def close(self) -> None:
        return None


class LocalStore(AffinityStore):
    """Choice records in this process: expired ones are dropped as new ones come, and
    beyond `max_hashes_per_worker` the least recently recorded."""

    name = "local"

    def __init__(self, max_hashes_per_worker: int = 1 << 18) -> None:
        self._max = max_hashes_per_worker
        # (worker id, epoch) -> block hash -> expiry (monotonic seconds)
        self._records: dict[tuple[str, int], OrderedDict[BlockHash, float]] = {}

    async def match(self, workers: Sequence[WorkerKey], prompt: PromptHashes) -> dict[str, int]:
        now = time.monotonic()
        result = {}
        for worker in workers:
            records = self._records.get((worker.worker_id, worker.epoch))
            if not records or not worker.has_prefix_cache:
                result[worker.worker_id] = 0
                continue
            chain = prompt.chain(worker.block_size)
            result[worker.worker_id] = leading_run([records.get(h, 0.0) > now for h in chain])
        return result

    async def record(self, worker: WorkerKey, hashes: Sequence[BlockHash], ttl_s: float) -> None:
        key = (worker.worker_id, worker.epoch)
        if key not in self._records:  # a new life of the worker: its old records are void
            for old in [k for k in self._records if k[0] == worker.worker_id]:
                del self._records[old]
        records = self._records.setdefault(key, OrderedDict())
        now = time.monotonic()
        expiry = now + ttl_s
        for block_hash in hashes:
            records[block_hash] = expiry
            records.move_to_end(block_hash)
        # NOTE: records are in the order they were last written, so with one TTL they
        # are in expiry order: the expired ones are at the front.
        while records and (len(records) > self._max or next(iter(records.values())) <= now):
            records.popitem(last=False)

    @property
    def num_records(self) -> int:
        return sum(len(records) for records in self._records.values())
