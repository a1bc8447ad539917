"""`pagoda worker` as a real process: SIGKILL leaves the registry within the TTL,
SIGTERM drains, deregisters and exits 0."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from shared.registry import RegistryKeys, live_workers
from tests.worker.service.conftest import request, wait_for

START_TIMEOUT = 120  # a cold interpreter importing torch on a busy 2-core machine


def wait_registered(client, keys, worker_id, process):
    def registered():
        assert process.process.poll() is None, f"worker exited early:\n{process.log()}"
        return next((w for w in live_workers(client, keys) if w.worker_id == worker_id), None)

    return wait_for(registered, timeout=START_TIMEOUT, interval=0.1, what="registration")


def is_serving(channel) -> bool:
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return status.status == health_pb2.HealthCheckResponse.SERVING


def test_sigkill_leaves_the_registry_within_the_ttl(spawn_worker, redis_url, redis_prefix):
    ttl = 2.0
    worker = spawn_worker(
        f"--redis-url={redis_url}",
        f"--redis-prefix={redis_prefix}",
        "--worker-id=w-kill",
        f"--heartbeat-ttl={ttl}",
    )
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    info = wait_registered(client, keys, "w-kill", worker)
    with grpc.insecure_channel(info.address) as channel:
        assert is_serving(channel)
        list(
            pb_grpc.WorkerServiceStub(channel).Generate(request([4] * 9, max_tokens=2), timeout=30)
        )
    wait_for(lambda: client.exists(keys.owned("w-kill", info.epoch)), what="ownership records")
    worker.process.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    worker.process.wait(30)

    def gone() -> bool:
        return not live_workers(client, keys) and not client.exists(
            keys.worker("w-kill"), keys.load("w-kill"), keys.owned("w-kill", info.epoch)
        )

    wait_for(gone, timeout=ttl + 5, interval=0.05, what="the registration to expire")
    assert time.monotonic() - killed_at <= ttl + 0.5


def test_sigterm_drains_then_deregisters_and_exits_0(spawn_worker, redis_url, redis_prefix):
    worker = spawn_worker(
        f"--redis-url={redis_url}",
        f"--redis-prefix={redis_prefix}",
        "--worker-id=w-term",
        "--heartbeat-ttl=30",
        "--drain-timeout=60",
        "--max-model-len=512",
    )
    client, keys = redis.Redis.from_url(redis_url), RegistryKeys(redis_prefix)
    info = wait_registered(client, keys, "w-term", worker)
    channel = grpc.insecure_channel(info.address)
    stub = pb_grpc.WorkerServiceStub(channel)
    call = stub.Generate(
        request([5] * 10, temperature=0, max_tokens=480, ignore_eos=True), timeout=120
    )
    responses = [next(call)]
    rest = threading.Thread(target=lambda: responses.extend(call))
    rest.start()
    worker.process.send_signal(signal.SIGTERM)
    # Draining: NOT_SERVING, and new requests are refused.
    wait_for(lambda: not is_serving(channel), what="NOT_SERVING")
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(request([5] * 10, max_tokens=2), timeout=30))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert rest.is_alive(), "the in-flight request should still be running"
    # ... while still registered (a router may still hold it) until the drain ends.
    assert client.exists(keys.worker("w-term"))
    rest.join(120)
    assert sum(len(o.token_ids) for r in responses for o in r.outputs) == 480
    assert worker.process.wait(60) == 0, worker.log()
    # Deregistered, not expired: the TTL was 30 s.
    assert list(client.scan_iter(f"{redis_prefix}:*")) == []
    assert "left the Redis registry" in worker.log()
    channel.close()
