from __future__ import annotations

import pytest

from shared.block_hash import block_hashes
from shared.sampling_params import SamplingParams
from worker.kv_cache.kv_cache_manager import KVCacheManager
from worker.request import Request

BLOCK = 4


def make_request(request_id: str, tokens: list[int], **params) -> Request:
    return Request(request_id, tokens, SamplingParams(**params), block_size=BLOCK)


def admit(manager: KVCacheManager, request: Request) -> list[int]:
    """What the scheduler does for a new request: look up, allocate, advance."""
    hits, num_hit = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - num_hit, hits) is not None
    request.num_computed_tokens = request.num_tokens
    return manager.get_block_ids(request.request_id)


def test_blocks_grow_with_tokens_and_full_blocks_are_cached():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    request = make_request("a", list(range(10)))
    assert admit(manager, request) == [0, 1, 2]
    assert [b.block_hash for b in manager.req_blocks["a"][:2]] == block_hashes(range(8), BLOCK)
    assert manager.req_blocks["a"][2].block_hash is None
    # Decode: tokens 11 and 12 fit in block 2; token 13 needs block 3.
    for token, expected in [(10, [0, 1, 2]), (11, [0, 1, 2]), (12, [0, 1, 2, 3])]:
        request.append_output_token(token)
        assert manager.allocate_slots(request, 1) is not None
        request.num_computed_tokens += 1
        assert manager.get_block_ids("a") == expected
    # Block 2 became full (tokens 8-11) once token 11 was scheduled.
    assert manager.req_blocks["a"][2].block_hash == block_hashes(list(range(12)), BLOCK)[2]
    manager.pool.check_integrity()


def test_prefix_hit_shares_blocks_by_reference():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    admit(manager, make_request("a", list(range(10))))
    b = make_request("b", list(range(9)) + [99])
    hits, num_hit = manager.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [0, 1] and num_hit == 8
    assert admit(manager, b) == [0, 1, 3]
    assert [manager.pool.blocks[i].ref_cnt for i in range(4)] == [2, 2, 1, 1]
    manager.pool.check_integrity()


def test_hit_stops_one_token_short_of_the_sequence():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    admit(manager, make_request("a", list(range(12))))
    # Same 8 tokens: two cached blocks exist, but only one may be used.
    hits, num_hit = manager.get_computed_blocks(make_request("b", list(range(8))))
    assert [h.block_id for h in hits] == [0] and num_hit == 4


def test_prompt_logprobs_skip_the_cache():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    admit(manager, make_request("a", list(range(12))))
    request = make_request("b", list(range(12)), prompt_logprobs=1)
    assert manager.get_computed_blocks(request) == ([], 0)


def test_failed_allocation_changes_nothing():
    manager = KVCacheManager(num_blocks=3, block_size=BLOCK)
    admit(manager, make_request("a", list(range(8))))
    big = make_request("b", list(range(100, 110)))
    assert manager.allocate_slots(big, 10) is None
    assert "b" not in manager.req_blocks
    assert manager.pool.num_free_blocks == 1
    assert manager.allocate_slots(big, 10, (), num_reserved_blocks=1) is None
    manager.pool.check_integrity()


def test_free_releases_tail_first_and_lru_evicts_tail_first():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK)
    a = make_request("a", list(range(13)))
    admit(manager, a)  # blocks 0-3, 0-2 cached
    manager.free(a)
    assert manager.pool.num_free_blocks == 4
    # Free queue order is now 3, 2, 1, 0: a new 2-block request evicts blocks 3 and 2.
    b = make_request("b", [50] * 5)
    assert admit(manager, b) == [3, 2]
    c = make_request("c", list(range(9)))
    hits, num_hit = manager.get_computed_blocks(c)
    assert [h.block_id for h in hits] == [0, 1] and num_hit == 8
    manager.pool.check_integrity()


def test_everything_free_or_cached_after_all_requests_leave():
    manager = KVCacheManager(num_blocks=16, block_size=BLOCK)
    requests = [make_request(str(i), list(range(i, i + 9))) for i in range(4)]
    for request in requests:
        admit(manager, request)
    for request in requests:
        manager.free(request)
    assert manager.num_used_blocks == 0
    assert manager.pool.num_free_blocks == 16
    assert manager.req_blocks == {}
    manager.pool.check_integrity()


def test_caching_disabled_registers_nothing():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK, enable_caching=False)
    admit(manager, make_request("a", list(range(10))))
    assert manager.pool.num_cached_blocks == 0
    assert manager.get_computed_blocks(make_request("b", list(range(10)))) == ([], 0)


def _state(manager: KVCacheManager) -> tuple:
    """Everything allocate_slots may change, comparable across managers."""
    return (
        {r: [b.block_id for b in blocks] for r, blocks in manager.req_blocks.items()},
        dict(manager._num_cached_blocks),
        [(b.block_id, b.ref_cnt, b.block_hash) for b in manager.pool.blocks],
        manager.pool.num_free_blocks,
    )


@pytest.mark.parametrize("caching", [True, False])
def test_the_nothing_needed_shortcut_does_what_the_general_path_does(monkeypatch, caching):
    """Decode three requests (one prefix-sharing) token by token through blocks
    filling up: the shortcut returns what the general path returns and leaves
    the same state, call for call."""
    fast = KVCacheManager(num_blocks=16, block_size=BLOCK, enable_caching=caching)
    plain = KVCacheManager(num_blocks=16, block_size=BLOCK, enable_caching=caching)
    monkeypatch.setattr(plain, "_needs_nothing", lambda *args: False)
    shortcuts = []
    real = fast._needs_nothing
    monkeypatch.setattr(
        fast, "_needs_nothing", lambda *args: shortcuts.append(real(*args)) or shortcuts[-1]
    )
    prompts = {"a": list(range(6)), "b": list(range(6)) + [50, 51, 52], "c": [9] * 3}
    pairs = []
    for name, prompt in prompts.items():
        pair = (make_request(name, prompt), make_request(name, prompt))
        for manager, request in zip((fast, plain), pair):
            admit(manager, request)
        pairs.append(pair)
    assert _state(fast) == _state(plain)
    for step in range(14):
        for pair in pairs:
            got = []
            for manager, request in zip((fast, plain), pair):
                request.append_output_token(100 + step)
                blocks = manager.allocate_slots(request, 1)
                got.append([b.block_id for b in blocks])
                request.num_computed_tokens += 1
            assert got[0] == got[1]
            assert _state(fast) == _state(plain)
    assert True in shortcuts and False in shortcuts  # both paths ran
    fast.pool.check_integrity()


def test_block_hashes_grow_as_a_fresh_hash_of_all_tokens_would():
    request = make_request("a", list(range(5)))
    for token in range(20, 31):
        request.append_output_token(token)
        assert request.block_hashes == block_hashes(request.all_token_ids, BLOCK)
