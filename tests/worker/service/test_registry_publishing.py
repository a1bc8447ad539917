"""What the worker keeps in a real Redis: registration, load, prefix ownership."""

from __future__ import annotations

import pytest
import redis

from shared.block_hash import block_hashes
from shared.registry import (
    RegistryKeys,
    WorkerInfo,
    WorkerLoad,
    live_workers,
    prefix_match_blocks,
)
from tests.conftest import random_prompts
from tests.redis_server import RedisServer
from tests.worker.service.conftest import generate, request, wait_for


def owned(client: redis.Redis, keys: RegistryKeys, worker) -> set[bytes]:
    identity = worker.server.identity
    return client.smembers(keys.owned(identity.worker_id, identity.epoch))


def start_registered(start_worker, url: str, prefix: str, **engine_options):
    service = {"redis_url": url, "redis_prefix": prefix, "worker_id": "w1", "heartbeat_ttl": 2.0}
    return start_worker(service=service, **engine_options)


def test_registration_and_load_appear(start_worker, redis_url, redis_prefix):
    worker = start_registered(start_worker, redis_url, redis_prefix)
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    workers = wait_for(lambda: live_workers(client, keys), what="the registration")
    assert [w.worker_id for w in workers] == ["w1"]
    info = workers[0]
    assert info.address == worker.address
    assert info.block_size == 4 and info.max_model_len == 128
    assert info.num_kv_blocks == 256 and info.kv_capacity_tokens == 1024
    assert info.model == str(worker.engine.spec.path) and info.architecture == "LlamaForCausalLM"
    assert info.epoch == worker.server.identity.epoch
    assert 0 < client.pttl(keys.worker("w1")) <= 2000
    generate(worker.stub, [3] * 9, temperature=0, max_tokens=20, ignore_eos=True)
    load = wait_for(
        lambda: (
            load
            if (load := WorkerLoad.from_mapping(client.hgetall(keys.load("w1")))).num_steps > 2
            else None
        ),
        what="a load record after the request",
    )
    assert load.num_kv_blocks_total == 256 and load.decode_tokens_per_second > 0
    assert 0 < client.pttl(keys.load("w1")) <= 2000


def test_ownership_records_are_exactly_the_cached_full_blocks(
    start_worker, redis_url, redis_prefix
):
    worker = start_registered(start_worker, redis_url, redis_prefix)
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    prompt, other = random_prompts([23, 13], seed=31)
    # max_tokens=1: the sampled token is never computed, so only the prompt's blocks fill.
    generate(worker.stub, prompt, temperature=0, max_tokens=1)
    expected = set(block_hashes(prompt, 4))
    assert len(expected) == 5
    wait_for(lambda: owned(client, keys, worker) == expected, what="the prompt's 5 blocks")
    # Output tokens fill blocks too: all computed tokens (not the last sampled one) count.
    out = generate(worker.stub, other, temperature=0, max_tokens=8, ignore_eos=True).token_ids()
    expected |= set(block_hashes(other + out[:-1], 4))
    wait_for(lambda: owned(client, keys, worker) == expected, what="both requests' blocks")
    # A salted prompt owns different hashes.
    salted = request(prompt, temperature=0, max_tokens=1)
    salted.cache_salt = b"tenant-a"
    list(worker.stub.Generate(salted, timeout=30))
    expected |= set(block_hashes(prompt, 4, b"tenant-a"))
    wait_for(lambda: owned(client, keys, worker) == expected, what="the salted blocks")
    # What a router computes from the registry agrees.
    info = live_workers(client, keys)
    assert prefix_match_blocks(client, keys, info, [*prompt, 1, 2, 3]) == {"w1": 5}
    assert 0 < client.pttl(keys.owned("w1", worker.server.identity.epoch)) <= 2000


def test_evicted_blocks_lose_their_records(start_worker, redis_url, redis_prefix):
    # 16 blocks of 4 tokens: a 63-token prompt takes the whole pool.
    worker = start_registered(
        start_worker, redis_url, redis_prefix, max_model_len=64, num_kv_blocks=16
    )
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    first, second = random_prompts([20, 63], seed=32)
    generate(worker.stub, first, temperature=0, max_tokens=1)
    first_hashes = set(block_hashes(first, 4))
    wait_for(lambda: owned(client, keys, worker) == first_hashes, what="the first prompt's blocks")
    generate(worker.stub, second, temperature=0, max_tokens=1)
    second_hashes = set(block_hashes(second, 4))
    assert len(second_hashes) == 15
    wait_for(lambda: owned(client, keys, worker) == second_hashes, what="only the second's blocks")
    assert worker.on_engine(
        lambda engine: all(
            engine.core.scheduler.kv.pool.get_cached_block(h) is None for h in first_hashes
        )
    )


def test_worker_serves_while_redis_is_down_and_registers_again(start_worker, redis_prefix):
    if not RedisServer.available():
        pytest.skip("needs the redis-server binary")
    server = RedisServer()
    server.start()
    try:
        worker = start_registered(start_worker, server.url, redis_prefix)
        client, keys = redis.Redis.from_url(server.url), RegistryKeys(redis_prefix)
        before, during = random_prompts([12, 16], seed=33)
        generate(worker.stub, before, temperature=0, max_tokens=1)
        wait_for(lambda: len(owned(client, keys, worker)) == 3, what="the first blocks")
        server.stop()
        # Redis is gone: the worker serves on, and its cache keeps changing.
        got = generate(worker.stub, during, temperature=0, max_tokens=5, ignore_eos=True)
        assert len(got.token_ids()) == 5
        server.start()  # empty: it lost everything
        expected = set(block_hashes(before, 4)) | set(
            block_hashes(during + got.token_ids()[:-1], 4)
        )
        wait_for(lambda: live_workers(client, keys), timeout=30, what="registration again")
        wait_for(lambda: owned(client, keys, worker) == expected, timeout=30, what="a full resync")
    finally:
        server.stop()


def test_every_start_is_a_new_epoch(start_worker, redis_url, redis_prefix):
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    first = start_registered(start_worker, redis_url, redis_prefix)
    prompt = random_prompts([16], seed=34)[0]
    generate(first.stub, prompt, temperature=0, max_tokens=1)
    wait_for(lambda: len(owned(client, keys, first)) == 4, what="ownership")
    old: WorkerInfo = wait_for(lambda: live_workers(client, keys))[0]
    first.stop()  # leaves the registry
    assert live_workers(client, keys) == []
    assert not client.exists(keys.owned("w1", old.epoch))
    second = start_registered(start_worker, redis_url, redis_prefix)
    new = wait_for(lambda: live_workers(client, keys))[0]
    assert new.worker_id == "w1" and new.epoch > old.epoch
    assert prefix_match_blocks(client, keys, [new], [*prompt, 1]) == {"w1": 0}
    assert second.server.identity.epoch == new.epoch
