"""Which blocks each request holds, and the prefix-cache policy on top of the pool."""

from __future__ import annotations

from collections.abc import Sequence

from worker.kv_cache.block_pool import BlockPool, KVBlock
from worker.request import Request


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        record_events: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, record_events=record_events)
        self.req_blocks: dict[str, list[KVBlock]] = {}
        # How many of a request's leading blocks are registered in the cache.
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of `request`, as blocks and as a token count.

        NOTE: a hit stops at least one token short of the whole sequence, so the
        last token is still computed and produces the logits to sample from.
        Requests that want prompt logprobs skip the cache: cached positions
        would have no logits.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        """Count a lookup once its request is admitted (failed admissions retry)."""
        if not self.enable_caching:
            return
        self.prefix_cache_queries += num_queried_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVBlock] = (),
        num_reserved_blocks: int = 0,
    ) -> list[KVBlock] | None:
        """Give `request` room for `num_new_tokens` more tokens after its computed ones
        (and after `new_computed_blocks`, a prefix hit). Returns the new blocks, or
        None, changing nothing, when the pool is short (keeping `num_reserved_blocks`
        spare).

        ```
        | computed | new_computed_blocks | num_new_tokens ... |
        ```
        """
        held = self.req_blocks.get(request.request_id)
        if held is not None and not new_computed_blocks and not num_reserved_blocks:
            if self._needs_nothing(request, held, num_new_tokens):
                return []
        elif held is None:
            held = []
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_tokens = num_computed + num_new_tokens
        num_required = -(-num_tokens // self.block_size)
        num_new_blocks = num_required - len(held) - len(new_computed_blocks)
        # Hits on idle cached blocks take them out of the free queue too.
        num_idle_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_idle_hits - num_reserved_blocks:
            return None
        blocks = self.req_blocks.setdefault(request.request_id, held)
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self._num_cached_blocks[request.request_id] = len(blocks)
        new_blocks = self.pool.allocate(max(num_new_blocks, 0))
        blocks.extend(new_blocks)
        if self.enable_caching:
            self._cache_full_blocks(request, blocks, num_tokens)
        return new_blocks

    def _needs_nothing(self, request: Request, held: list[KVBlock], num_new_tokens: int) -> bool:
        """Whether the tokens fit the blocks held and fill none the cache does not
        know yet: most calls (a running request's next token), where the general
        path changes nothing either, at a fraction of its cost."""
        num_tokens = request.num_computed_tokens + num_new_tokens
        if -(-num_tokens // self.block_size) > len(held):
            return False
        if not self.enable_caching:
            return True
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        return num_full <= self._num_cached_blocks.get(request.request_id, 0)

    def _cache_full_blocks(self, request: Request, blocks: list[KVBlock], num_tokens: int) -> None:
        # NOTE: blocks are registered once their tokens are scheduled, before the step
        # computes them. A request that hits them within the same step reads them after
        # the same layer wrote them, so the content is always there when read.
        start = self._num_cached_blocks.get(request.request_id, 0)
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], request.block_hashes[i])
        self._num_cached_blocks[request.request_id] = max(start, num_full)

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first, so a sequence's tail is
        evicted before its (more shareable) head."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def num_slots_allocated(self) -> int:
        return sum(map(len, self.req_blocks.values())) * self.block_size

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks
