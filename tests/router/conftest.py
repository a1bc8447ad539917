"""Router test fixtures, shared by the whole session: the tiny checkpoint's tokenizer;
`pagoda serve` with two workers (its in-process affinity store, an API key); and a
cluster of two workers and three routers over a Redis of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis

from router.text.tokenizer import Tokenizer
from shared.registry import RegistryKeys, live_workers
from tests.cluster import (
    ENGINE_FLAGS,
    PagodaProcess,
    RouterProcess,
    start_router,
    start_worker,
    stop_all,
    wait_serving,
)
from tests.redis_server import RedisServer

API_KEY = "test-key"
MODEL = "tiny"
MAX_TOKENS_PER_REQUEST = 8192


@pytest.fixture(scope="session")
def tokenizer(make_checkpoint) -> Tokenizer:
    return Tokenizer.load(str(make_checkpoint("llama")))


@dataclass
class Served:
    router: RouterProcess

    @property
    def base_url(self) -> str:
        return self.router.base_url

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {API_KEY}"}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)


@contextmanager
def serving(args: list[str], log_path: Path, num_workers: int) -> Iterator[Served]:
    """`pagoda serve ARGS` until the block ends, once `num_workers` workers serve."""
    router = start_router("serve", args, log_path)
    try:
        wait_serving(router.process, router.base_url, num_workers)
        yield Served(router)
    finally:
        router.process.stop()


@pytest.fixture(scope="session")
def served(make_checkpoint, tmp_path_factory):
    """`pagoda serve` with two workers; no Redis (its embedded store); X-Request-Id echoed."""
    args = [str(make_checkpoint("llama")), "--num-workers=2", f"--served-model-name={MODEL}"]
    args += [f"--api-key={API_KEY}", "--enable-request-id-headers"]
    args += [f"--max-tokens-per-request={MAX_TOKENS_PER_REQUEST}", *ENGINE_FLAGS]
    with serving(args, tmp_path_factory.mktemp("serve") / "serve.log", 2) as served:
        yield served


@dataclass
class Cluster:
    """Redis of the cluster's own, two workers registered there, routers reading it."""

    redis: RedisServer
    prefix: str
    workers: list[PagodaProcess]
    routers: dict[str, RouterProcess]
    model: Path
    log_dir: Path

    def client(self, router: str = "a") -> openai.OpenAI:
        base_url = self.routers[router].base_url
        return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

    def worker_args(self, worker_id: str) -> list[str]:
        return [
            f"--redis-url={self.redis.url}",
            f"--redis-prefix={self.prefix}",
            f"--worker-id={worker_id}",
            f"--served-model-name={MODEL}",
            "--heartbeat-ttl=2",
        ]

    def live_worker_ids(self) -> list[str]:
        client = redis.Redis.from_url(self.redis.url, socket_timeout=1)
        try:
            return [w.worker_id for w in live_workers(client, RegistryKeys(self.prefix))]
        except redis.RedisError:
            return []
        finally:
            client.close()


@pytest.fixture(scope="session")
def cluster(make_checkpoint, tmp_path_factory):
    """Two workers and three routers over one Redis: routers a and b route by prefix
    affinity, router "load" by load alone (the control)."""
    if not RedisServer.available():
        pytest.skip("needs a redis-server binary: the cluster stops and restarts its Redis")
    log_dir = tmp_path_factory.mktemp("cluster")
    server = RedisServer()
    server.start()
    cluster = Cluster(server, "cluster", [], {}, make_checkpoint("llama"), log_dir)
    try:
        for i in range(2):
            log = log_dir / f"worker-{i}.log"
            cluster.workers.append(start_worker(cluster.model, cluster.worker_args(f"w{i}"), log))
        for name in ("a", "b", "load"):
            args = [f"--redis-url={server.url}", f"--redis-prefix={cluster.prefix}"]
            args += [
                "--load-interval=0.2",
                f"--routing-policy={'load' if name == 'load' else 'affinity'}",
            ]
            cluster.routers[name] = start_router("router", args, log_dir / f"router-{name}.log")
        for router in cluster.routers.values():
            wait_serving(router.process, router.base_url, 2)
        yield cluster
    finally:
        stop_all([r.process for r in cluster.routers.values()] + cluster.workers)
        server.stop()
