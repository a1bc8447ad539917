"""Workers for tests: in this process (on its own event loop thread) or as a real
`pagoda worker` process; both reached over real gRPC on loopback."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from tests.cluster import PagodaProcess
from tests.conftest import wait_for
from worker.config import EngineConfig
from worker.service.background import BackgroundWorker
from worker.service.config import WorkerServiceConfig

# Tiny pool and blocks, so tests can count blocks and force eviction.
ENGINE = dict(block_size=4, max_model_len=128, num_kv_blocks=256)


class InProcessWorker(BackgroundWorker):
    """A BackgroundWorker with a gRPC channel and stub to it."""

    channel: grpc.Channel | None = None

    def start(self, timeout: float = 120.0) -> InProcessWorker:
        super().start(timeout)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        return self

    def stop(self, drain_timeout: float | None = None) -> None:
        if self.channel is not None:
            self.channel.close()
        super().stop(drain_timeout)


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


def load_when(worker, predicate, what: str) -> pb.GetLoadResponse:
    """Poll GetLoad until predicate(load) holds; return that load."""

    def check():
        load = worker.stub.GetLoad(pb.GetLoadRequest())
        return load if predicate(load) else None

    return wait_for(check, what=what)


def one_running_one_waiting(worker, running_prompt: list[int], waiting_prompt: list[int], **params):
    """On a worker with --max-num-seqs 1: start one long request, then queue a second
    behind it. Returns both calls (cancel them to end them)."""
    long = {"temperature": 0, "max_tokens": 400, "ignore_eos": True}
    running = worker.stub.Generate(request(running_prompt, **long), timeout=60)
    next(running)  # it is running
    waiting = worker.stub.Generate(request(waiting_prompt, **(params or long)), timeout=60)
    load_when(worker, lambda load: load.num_waiting_requests == 1, "a waiting request")
    return running, waiting


def pool_is_idle(engine) -> bool:
    """Every block free or cached-free, no request left, integrity holds."""
    pool = engine.core.scheduler.kv.pool
    pool.check_integrity()
    return not engine.has_unfinished_requests() and pool.num_free_blocks == pool.num_blocks


@pytest.fixture
def spawn_worker(make_checkpoint, tmp_path):
    """spawn_worker(*flags) -> a `pagoda worker` process on the tiny checkpoint; always
    killed after."""
    spawned: list[PagodaProcess] = []

    def spawn(*flags: str) -> PagodaProcess:
        path = make_checkpoint("llama")
        args = ["--model", str(path), "--host", "127.0.0.1", "--port", "0"]
        args += [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        worker = PagodaProcess("worker", [*args, *flags], tmp_path / f"worker-{len(spawned)}.log")
        spawned.append(worker)
        return worker

    yield spawn
    for worker in spawned:
        worker.stop(timeout=0)
