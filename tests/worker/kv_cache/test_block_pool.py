from __future__ import annotations

from worker.kv_cache.block_pool import BlockPool, BlockRemoved, BlockStored


def ids(blocks):
    return [b.block_id for b in blocks]


def test_allocate_takes_lowest_free_blocks_in_order():
    pool = BlockPool(6)
    assert ids(pool.allocate(3)) == [0, 1, 2]
    assert ids(pool.allocate(2)) == [3, 4]
    assert pool.num_free_blocks == 1
    pool.check_integrity()


def test_free_order_is_eviction_order():
    pool = BlockPool(4)
    a, b, c, d = pool.allocate(4)
    pool.free([c, a])
    pool.free([d, b])
    assert ids(pool.allocate(4)) == [2, 0, 3, 1]
    pool.check_integrity()


def test_shared_block_returns_to_queue_only_at_zero_references():
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"h" * 16)
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free([block])
    assert pool.num_free_blocks == 2
    pool.free([block])
    assert block.ref_cnt == 0 and pool.num_free_blocks == 3
    pool.check_integrity()


def test_cache_hit_pulls_idle_block_out_of_queue():
    pool = BlockPool(3, record_events=True)
    x, y = pool.allocate(2)
    pool.cache_block(x, b"x" * 16)
    pool.free([x, y])
    assert pool.get_cached_block(b"x" * 16) is x
    pool.touch([x])
    assert x.ref_cnt == 1
    # Remaining free queue: block 2 (never used), then y.
    assert ids(pool.allocate(2)) == [2, 1]
    assert pool.take_events() == [BlockStored(b"x" * 16)]
    pool.check_integrity()


def test_lru_eviction_removes_hash_and_emits_event():
    pool = BlockPool(2, record_events=True)
    a, b = pool.allocate(2)
    pool.cache_block(a, b"a" * 16)
    pool.cache_block(b, b"b" * 16)
    pool.free([b, a])  # b freed first: least recently used
    (new,) = pool.allocate(1)
    assert new is b and new.block_hash is None
    assert pool.get_cached_block(b"b" * 16) is None
    assert pool.get_cached_block(b"a" * 16) is a
    assert pool.take_events() == [
        BlockStored(b"a" * 16),
        BlockStored(b"b" * 16),
        BlockRemoved(b"b" * 16),
    ]
    assert pool.take_events() == []
    pool.check_integrity()


def test_duplicate_hash_keeps_first_block():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache_block(a, b"same" * 4)
    pool.cache_block(b, b"same" * 4)
    assert pool.get_cached_block(b"same" * 4) is a
    assert b.block_hash is None
    pool.check_integrity()


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.cache_block(a, b"a" * 16)
    assert not pool.reset_prefix_cache()
    pool.free([a])
    assert pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0
    pool.check_integrity()
