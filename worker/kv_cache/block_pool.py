"""A fixed pool of KV blocks with reference counts and an LRU prefix cache.

A block is in exactly one of three states:
    in use       ref_cnt > 0 (held by one or more requests; may be cached)
    cached free  ref_cnt == 0, has a hash: reusable by a prefix hit, evictable
    free         ref_cnt == 0, no hash
Free and cached-free blocks sit in one queue in eviction order: allocation
takes from the head, freeing appends to the tail, a cache hit pulls a block
out of the queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from shared.block_hash import BlockHash


class KVBlock:
    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


@dataclass(frozen=True)
class BlockStored:
    block_hash: BlockHash


@dataclass(frozen=True)
class BlockRemoved:
    block_hash: BlockHash


KVCacheEvent = BlockStored | BlockRemoved


class BlockPool:
    def __init__(self, num_blocks: int, record_events: bool = False) -> None:
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks
        )
        self._cached: dict[BlockHash, KVBlock] = {}
        # Kept incrementally: per-step stats must not scan every block.
        self.num_cached_free_blocks = 0
        self.record_events = record_events
        self._events: list[KVCacheEvent] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free plus cached-free."""
        return len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        """Take blocks from the head of the queue, evicting their cached prefixes."""
        assert num_blocks <= len(self._free_queue), "allocate() beyond the free blocks"
        blocks = []
        for _ in range(num_blocks):
            _, block = self._free_queue.popitem(last=False)
            if block.block_hash is not None:
                self.num_cached_free_blocks -= 1
                self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cache-hit blocks, pulling idle ones out of the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free_queue[block.block_id]
                self.num_cached_free_blocks -= 1  # only cached blocks are hit
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop a reference; blocks reaching zero join the queue tail in the order given,
        so the first given is the first evicted."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free_queue[block.block_id] = block
                if block.block_hash is not None:
                    self.num_cached_free_blocks += 1

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Make `block` findable by `block_hash`. If another block already holds that
        prefix, this one stays unhashed and is simply freed later."""
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block
        if self.record_events:
            self._events.append(BlockStored(block_hash))

    def _evict(self, block: KVBlock) -> None:
        del self._cached[block.block_hash]
        if self.record_events:
            self._events.append(BlockRemoved(block.block_hash))
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only possible while no block is in use."""
        if any(b.ref_cnt for b in self.blocks):
            return False
        for block in list(self._cached.values()):
            self._evict(block)
        self.num_cached_free_blocks = 0
        return True

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def check_integrity(self) -> None:
        in_use = [b for b in self.blocks if b.ref_cnt > 0]
        assert all(b.ref_cnt >= 0 for b in self.blocks), "negative reference count"
        assert len(in_use) + len(self._free_queue) == self.num_blocks, "blocks lost or doubled"
        assert all(b.ref_cnt == 0 for b in self._free_queue.values()), (
            "referenced block in free queue"
        )
        for block_hash, block in self._cached.items():
            assert block.block_hash == block_hash, "cache index out of sync"
        hashed = sum(b.block_hash is not None for b in self.blocks)
        assert hashed == len(self._cached), "hashed block missing from the cache index"
        cached_free = sum(b.block_hash is not None for b in self._free_queue.values())
        assert cached_free == self.num_cached_free_blocks, "cached-free count out of sync"
