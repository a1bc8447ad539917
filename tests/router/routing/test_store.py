"""Affinity stores: the in-process one, and Redis shared by routers and workers."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from router.routing.redis_store import RedisStore
from router.routing.store import LocalStore, PromptHashes, StoreUnavailable, WorkerKey
from shared.registry import RegistryKeys, WorkerInfo, queue_ownership_changes
from tests.conftest import random_prompts
from tests.redis_server import RedisServer

A, B = WorkerKey("a", 1, 4), WorkerKey("b", 7, 4)
PROMPT = random_prompts([22], seed=5)[0]  # 5 full blocks of 4


def run(coro):
    return asyncio.run(coro)


def test_local_choices_match_the_leading_run_until_they_expire():
    store, prompt = LocalStore(), PromptHashes(PROMPT)

    async def scenario():
        await store.record(A, prompt.chain(4)[:3], ttl_s=60)
        await store.record(B, prompt.chain(4)[1:], ttl_s=0.05)  # no first block: no run
        assert await store.match([A, B], prompt) == {"a": 3, "b": 0}
        await store.record(B, prompt.chain(4), ttl_s=0.05)
        assert (await store.match([A, B], prompt))["b"] == 5
        await asyncio.sleep(0.1)
        assert (await store.match([A, B], prompt))["b"] == 0
        # A new life of a worker (another epoch) holds nothing of the old one.
        assert (await store.match([WorkerKey("a", 2, 4)], prompt)) == {"a": 0}

    run(scenario())


def test_local_store_forgets_the_oldest_records_beyond_its_bound():
    store, prompt = LocalStore(max_hashes_per_worker=2), PromptHashes(PROMPT)

    async def scenario():
        await store.record(A, prompt.chain(4)[:3], ttl_s=60)  # keeps blocks 1 and 2
        assert await store.match([A], prompt) == {"a": 0}
        await store.record(A, prompt.chain(4)[:1], ttl_s=60)  # keeps 2 and 0
        assert await store.match([A], prompt) == {"a": 1}

    run(scenario())


def test_local_store_drops_expired_records_as_new_ones_come():
    store = LocalStore()
    prompts = [PromptHashes(p) for p in random_prompts([8] * 50, seed=9)]

    async def scenario():
        for prompt in prompts[:40]:
            await store.record(A, prompt.chain(4), ttl_s=0.05)
        assert store.num_records == 80
        await asyncio.sleep(0.1)
        for prompt in prompts[40:]:
            await store.record(A, prompt.chain(4), ttl_s=60)
        assert store.num_records == 20  # the 80 expired ones are gone, not just ignored
        assert await store.match([A], prompts[45]) == {"a": 2}

    run(scenario())


def test_routers_sharing_redis_see_each_others_choices_and_workers_ownership(
    redis_url, redis_prefix
):
    prompt = PromptHashes(PROMPT)
    chain = prompt.chain(4)
    # Worker b announces it holds blocks 0-1 (as its registry publisher would).
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    pipe = client.pipeline()
    queue_ownership_changes(pipe, keys, WorkerInfo("b", "x:1", "m", epoch=7), chain[:2], [], 60_000)
    pipe.execute()

    async def scenario():
        first, second = RedisStore(redis_url, redis_prefix), RedisStore(redis_url, redis_prefix)
        try:
            assert await second.match([A, B], prompt) == {"a": 0, "b": 2}
            await first.record(A, chain, ttl_s=30)
            # b: owned 0-1 plus a choice for 2-4 continues the run.
            await first.record(B, chain[2:], ttl_s=30)
            assert await second.match([A, B], prompt) == {"a": 5, "b": 5}
            await first.record(A, chain, ttl_s=0.05)  # a choice lapses with its TTL
            await asyncio.sleep(0.1)
            assert await second.match([A, B], prompt) == {"a": 0, "b": 5}
        finally:
            await first.close()
            await second.close()

    run(scenario())
    client.close()


@pytest.mark.skipif(not RedisServer.available(), reason="needs a redis-server binary")
def test_redis_down_is_said_at_once_and_its_return_is_noticed():
    server = RedisServer()
    server.start()

    async def scenario():
        store, prompt = RedisStore(server.url, "t"), PromptHashes(PROMPT)
        try:
            assert await store.match([A], prompt) == {"a": 0}
            server.stop()
            with pytest.raises(StoreUnavailable):
                await store.match([A], prompt)
            assert not store.is_available and not await store.probe()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):  # no I/O while it is known down
                await store.match([A], prompt)
            assert time.monotonic() - started < 0.01
            await store.record(A, prompt.chain(4), ttl_s=30)  # dropped, no error
            server.start()
            assert await store.probe() and store.is_available
            await store.record(A, prompt.chain(4), ttl_s=30)
            assert await store.match([A], prompt) == {"a": 5}
        finally:
            await store.close()

    try:
        run(scenario())
    finally:
        server.stop()
