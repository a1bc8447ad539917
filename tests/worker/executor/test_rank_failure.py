"""A rank that dies takes its worker down cleanly: the step fails UNAVAILABLE
instead of hanging, health turns NOT_SERVING, the worker exits, and no rank
process is left behind."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.errors import UnavailableError
from shared.ports import free_port_run
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from tests.cluster import PagodaProcess
from tests.conftest import random_prompts, wait_for
from tests.worker.service.conftest import request
from worker import SamplingParams
from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.executor import ExecutorFailure
from worker.service.background import BackgroundWorker
from worker.service.config import WorkerServiceConfig

ENGINE = dict(block_size=4, max_model_len=128, num_kv_blocks=64, tensor_parallel_size=2)
LONG = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)


def _is_gone(pid: int) -> bool:
    """Exited (and reaped, or a zombie waiting for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _rank_pids(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"worker.executor.rank_process" in cmdline:
            pids.append(int(stat.parent.name))
    return sorted(pids)


@pytest.mark.slow  # the worker-process test below covers this path too
def test_a_rank_killed_mid_step_fails_the_step_instead_of_hanging(make_checkpoint):
    engine = LLMEngine(EngineConfig.from_kwargs(model=str(make_checkpoint("llama")), **ENGINE))
    executor = engine.core.executor
    try:
        engine.add_request("r", random_prompts([9])[0], LONG)
        engine.step()
        executor.processes[1].send_signal(signal.SIGKILL)
        raised: list[BaseException] = []

        def step_until_it_fails():
            try:
                while engine.has_unfinished_requests():
                    engine.step()
            except BaseException as exc:
                raised.append(exc)

        stepping = threading.Thread(target=step_until_it_fails, daemon=True)
        stepping.start()
        stepping.join(60)
        assert not stepping.is_alive(), "a step hung on the dead rank"
        (error,) = raised
        assert isinstance(error, ExecutorFailure) and isinstance(error, UnavailableError)
        assert "tensor-parallel rank 1" in str(error) and "exited with code -9" in str(error)
    finally:
        engine.shutdown()
    assert all(p.poll() is not None for p in executor.processes)


def test_a_rank_that_dies_while_the_worker_is_idle_is_noticed(make_checkpoint):
    """No step runs to trip over it: the rank monitor fails the engine, health
    turns NOT_SERVING and the server marks itself failed (the CLI then exits)."""
    config = EngineConfig.from_kwargs(model=str(make_checkpoint("llama")), **ENGINE)
    worker = BackgroundWorker(config, WorkerServiceConfig(host="127.0.0.1", port=0))
    worker.start()
    try:
        worker.engine.core.executor.processes[0].send_signal(signal.SIGKILL)
        wait_for(worker.server.failed.is_set, timeout=30, what="the server to fail")
        assert "tensor-parallel rank 0" in str(worker.server.engine_loop.fatal_error)
        with grpc.insecure_channel(worker.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as err:
                list(pb_grpc.WorkerServiceStub(channel).Generate(request([5, 6]), timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        worker.stop()
    assert all(p.poll() is not None for p in worker.engine.core.executor.processes)


def test_the_worker_reports_not_serving_ends_streams_unavailable_and_exits(
    make_checkpoint, tmp_path
):
    port = free_port_run()
    args = ["--model", str(make_checkpoint("llama")), "--host", "127.0.0.1", f"--port={port}"]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    worker = PagodaProcess("worker", args, tmp_path / "worker.log")
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        health = health_pb2_grpc.HealthStub(channel)

        def serving():
            worker.check_alive()
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
            except grpc.RpcError:
                return False
            return status == health_pb2.HealthCheckResponse.SERVING

        wait_for(serving, timeout=180, interval=0.2, what="the worker serving")
        ranks = _rank_pids(worker.process.pid)
        assert len(ranks) == 2
        stub = pb_grpc.WorkerServiceStub(channel)
        # The router sees one worker: the group's blocks (each rank holds its heads of each).
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert (info.num_kv_blocks, info.kv_capacity_tokens) == (64, 256)
        stream = stub.Generate(
            request([5] * 9, temperature=0, max_tokens=100, ignore_eos=True), timeout=60
        )
        next(stream)  # in flight
        os.kill(ranks[1], signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "tensor-parallel rank 1" in err.value.details()
        try:
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
            assert status != health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError as exc:  # or already shutting down, or gone
            assert exc.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert worker.process.wait(60) == 1
        channel.close()
        wait_for(lambda: all(_is_gone(pid) for pid in ranks), timeout=30, what="ranks to exit")
    finally:
        worker.stop(timeout=5)


@pytest.mark.slow
def test_ranks_die_with_their_worker(make_checkpoint, tmp_path):
    """SIGKILL gives the worker no chance to stop them: PR_SET_PDEATHSIG does."""
    port = free_port_run()
    args = ["--model", str(make_checkpoint("llama")), "--host", "127.0.0.1", f"--port={port}"]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    worker = PagodaProcess("worker", args, tmp_path / "worker.log")
    try:
        ranks = wait_for(
            lambda: worker.check_alive() or (_rank_pids(worker.process.pid)[1:] and
                                             _rank_pids(worker.process.pid)),
            timeout=180, interval=0.2, what="two ranks",
        )  # fmt: skip
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(30)
        wait_for(lambda: all(_is_gone(pid) for pid in ranks), timeout=30, what="ranks to exit")
    finally:
        worker.stop(timeout=5)
