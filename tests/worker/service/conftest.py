"""Workers for tests: in this process (on its own event loop thread) or as a real
`pagoda worker` process; both reached over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import uvloop

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from tests.conftest import wait_for  # noqa: F401 - re-exported for the tests here
from worker.config import EngineConfig
from worker.service.config import WorkerServiceConfig
from worker.service.server import WorkerServer

REPO_ROOT = Path(__file__).resolve().parents[3]
# Tiny pool and blocks, so tests can count blocks and force eviction.
ENGINE = dict(block_size=4, max_model_len=128, num_kv_blocks=256)


class InProcessWorker:
    def __init__(self, engine_config: EngineConfig, config: WorkerServiceConfig) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server = WorkerServer(engine_config, config)
        self.channel: grpc.Channel | None = None

    def start(self) -> InProcessWorker:
        self.thread.start()
        self.run(self.server.start(), timeout=120)
        self.address = f"127.0.0.1:{self.server.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        return self

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_engine(self, fn) -> Any:
        """Run fn(engine) on the engine thread, between steps."""
        return self.server.engine_loop.call(fn).result(30)

    @property
    def engine(self):
        return self.server.engine

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.thread.is_alive():
            self.run(self.server.stop(), timeout=60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
        self.loop.close()


@pytest.fixture
def start_worker(make_checkpoint):
    """start_worker(**options) -> a started InProcessWorker; engine options are keyword
    arguments named like the flags (on top of ENGINE), service ones go in `service`."""
    started: list[InProcessWorker] = []

    def start(service: dict | None = None, **engine_options: Any) -> InProcessWorker:
        path = make_checkpoint("llama")
        engine_config = EngineConfig.from_kwargs(model=str(path), **{**ENGINE, **engine_options})
        config = WorkerServiceConfig(
            **{"host": "127.0.0.1", "port": 0, "redis_url": None, **(service or {})}
        )
        worker = InProcessWorker(engine_config, config)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@dataclass
class Generation:
    """A whole Generate stream, collected."""

    responses: list[pb.GenerateResponse] = field(default_factory=list)

    def token_ids(self, index: int = 0) -> list[int]:
        return [
            t for r in self.responses for o in r.outputs if o.index == index for t in o.token_ids
        ]

    def finish_reason(self, index: int = 0) -> int:
        reasons = [o.finish_reason for r in self.responses for o in r.outputs if o.index == index]
        return reasons[-1] if reasons else pb.FINISH_REASON_UNSPECIFIED


def request(prompt: list[int], request_id: str = "", **params: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=pb.SamplingParams(**params),
    )


def generate(stub: pb_grpc.WorkerServiceStub, prompt: list[int], **params: Any) -> Generation:
    return Generation(list(stub.Generate(request(prompt, **params), timeout=60)))


def pool_is_idle(engine) -> bool:
    """Every block free or cached-free, no request left, integrity holds."""
    pool = engine.core.scheduler.kv.pool
    pool.check_integrity()
    return not engine.has_unfinished_requests() and pool.num_free_blocks == pool.num_blocks


class WorkerProcess:
    """`python -m shared.cli worker ...` as a child process, logging to a file."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in kill()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", "worker", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._log.close()


@pytest.fixture
def spawn_worker(make_checkpoint, tmp_path):
    """spawn_worker(*flags) -> a WorkerProcess on the tiny checkpoint; always killed after."""
    spawned: list[WorkerProcess] = []

    def spawn(*flags: str) -> WorkerProcess:
        path = make_checkpoint("llama")
        args = ["--model", str(path), "--host", "127.0.0.1", "--port", "0"]
        args += [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        worker = WorkerProcess([*args, *flags], tmp_path / f"worker-{len(spawned)}.log")
        spawned.append(worker)
        return worker

    yield spawn
    for worker in spawned:
        worker.kill()
