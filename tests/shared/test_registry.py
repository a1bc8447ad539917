"""The Redis key schema against a real Redis: what workers write is what routers read."""

from __future__ import annotations

import time

import pytest
import redis

from shared.block_hash import block_hashes
from shared.registry import (
    RegistryKeys,
    WorkerInfo,
    WorkerLoad,
    deregister,
    live_workers,
    make_client,
    prefix_match_blocks,
    queue_heartbeat,
    queue_ownership_changes,
    queue_ownership_rewrite,
    worker_loads,
)
from tests.conftest import random_prompts, wait_for

TTL_MS = 10_000


@pytest.fixture
def client(redis_url):
    client = make_client(redis_url)
    yield client
    client.close()


def beat(client, keys, info, load=None, ttl_ms=TTL_MS) -> int:
    pipe = client.pipeline(transaction=False)
    check = queue_heartbeat(pipe, keys, info, load or WorkerLoad(), ttl_ms)
    return pipe.execute()[check]


def own(client, keys, info, added=(), removed=()):
    pipe = client.pipeline(transaction=False)
    queue_ownership_changes(pipe, keys, info, list(added), list(removed), TTL_MS)
    pipe.execute()


def test_records_round_trip(client, redis_prefix):
    keys = RegistryKeys(redis_prefix)
    info = WorkerInfo("w1", "10.0.0.1:50051", "m", "LlamaForCausalLM", 16, 4096, 100, 1600, epoch=7)
    load = WorkerLoad(num_running_requests=3, decode_tokens_per_second=12.5, is_draining=True)
    beat(client, keys, info, load)
    assert live_workers(client, keys) == [info]
    assert worker_loads(client, keys, ["w1", "absent"]) == {"w1": load}
    # Unknown fields from a newer writer are ignored.
    client.hset(keys.worker("w1"), "some_future_field", "x")
    assert live_workers(client, keys) == [info]


def test_a_worker_whose_heartbeat_lapses_is_not_live(client, redis_prefix):
    keys = RegistryKeys(redis_prefix)
    # 2 s, not less: on a loaded machine the first check may come a second late.
    beat(client, keys, WorkerInfo("short", "a:1", "m"), ttl_ms=2000)
    beat(client, keys, WorkerInfo("long", "b:1", "m"))
    assert {w.worker_id for w in live_workers(client, keys)} == {"short", "long"}
    wait_for(lambda: [w.worker_id for w in live_workers(client, keys)] == ["long"], timeout=10)
    assert not client.exists(keys.worker("short"), keys.load("short"))
    deregister(client, keys, WorkerInfo("long", "b:1", "m"))
    assert live_workers(client, keys) == []
    assert list(client.scan_iter(f"{redis_prefix}:*")) == [f"{redis_prefix}:workers".encode()]


def test_prefix_match_counts_the_leading_run_each_worker_holds(client, redis_prefix):
    keys = RegistryKeys(redis_prefix)
    prompt = random_prompts([26], seed=41)[0]
    chain4, chain8 = block_hashes(prompt, 4), block_hashes(prompt, 8)  # 6 and 3 blocks
    full = WorkerInfo("full", "a:1", "m", block_size=4, epoch=1)
    gap = WorkerInfo("gap", "b:1", "m", block_size=4, epoch=1)
    big = WorkerInfo("big", "c:1", "m", block_size=8, epoch=1)
    off = WorkerInfo("off", "d:1", "m", block_size=4, epoch=1, enable_prefix_caching=False)
    restarted = WorkerInfo("restarted", "e:1", "m", block_size=4, epoch=2)
    for info in (full, gap, big, off, restarted):
        beat(client, keys, info)
    own(client, keys, full, added=chain4)
    own(client, keys, gap, added=chain4[:2] + chain4[3:])  # block 2 was evicted
    own(client, keys, big, added=chain8[:2])
    own(client, keys, off, added=chain4)  # never read: its caching is off
    # Records of the previous life (epoch 1) of a restarted worker are ignored.
    own(client, keys, WorkerInfo("restarted", "e:1", "m", block_size=4, epoch=1), added=chain4)
    workers = live_workers(client, keys)
    assert prefix_match_blocks(client, keys, workers, prompt) == {
        "full": 6,
        "gap": 2,
        "big": 2,
        "off": 0,
        "restarted": 0,
    }
    # A different prompt matches nothing; a too-short one asks nothing.
    assert set(prefix_match_blocks(client, keys, workers, prompt[::-1]).values()) == {0}
    assert set(prefix_match_blocks(client, keys, workers, prompt[:3]).values()) == {0}


def test_ownership_set_keeps_its_ttl_and_can_be_rewritten(client, redis_prefix):
    keys = RegistryKeys(redis_prefix)
    info = WorkerInfo("w", "a:1", "m", block_size=4, epoch=3)
    key = keys.owned("w", 3)
    hashes = block_hashes(list(range(40)), 4)
    own(client, keys, info, added=hashes[:2])
    own(client, keys, info, removed=hashes[:2])  # emptied: Redis deletes the set
    assert not client.exists(key)
    own(client, keys, info, added=hashes[2:4])  # recreated, with a TTL again
    assert 0 < client.pttl(key) <= TTL_MS
    assert beat(client, keys, info) == 1  # the heartbeat saw the set
    client.delete(key)
    assert beat(client, keys, info) == 0  # ... and sees it is gone
    pipe = client.pipeline(transaction=False)
    queue_ownership_rewrite(pipe, keys, info, hashes[5:], TTL_MS)
    pipe.execute()
    assert client.smembers(key) == set(hashes[5:]) and 0 < client.pttl(key) <= TTL_MS


def test_client_fails_fast_when_redis_is_down():
    from shared.ports import free_port_run

    client = make_client(f"redis://127.0.0.1:{free_port_run()}/0", timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - start < 2
