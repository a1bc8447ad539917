"""`pagoda serve` and `pagoda router` as processes: start-up refusals and a clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import grpc
import httpx
import pytest

from shared.ports import free_port_run
from shared.proto.pagoda.v1 import router_pb2 as pb
from shared.proto.pagoda.v1 import router_pb2_grpc as pb_grpc
from tests.cluster import ENGINE_FLAGS, REPO_ROOT, start_router, wait_serving
from tests.conftest import wait_for


def test_ctrl_c_stops_serve_and_its_workers_cleanly(make_checkpoint, tmp_path):
    router = start_router(
        "serve", [str(make_checkpoint("llama")), *ENGINE_FLAGS], tmp_path / "serve.log"
    )
    try:
        wait_serving(router.process, router.base_url, 1)
        pids = [
            int(p) for p in re.findall(r"started worker \d+ \(pid (\d+)\)", router.process.log())
        ]
        assert len(pids) == 1  # --num-workers defaults to 1
        router.process.process.send_signal(signal.SIGINT)
        assert router.process.process.wait(60) == 0, router.process.log()[-4000:]
    finally:
        router.process.stop()
    for pid in pids:  # reaped by serve, not orphaned
        try:
            os.kill(pid, 0)
            raise AssertionError(f"worker pid {pid} outlived pagoda serve")
        except ProcessLookupError:
            pass
    log = router.process.log()
    assert "shutting down: the router first, then the workers" in log
    assert "worker.service.cli: shutting down" in log


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip


def test_a_router_with_no_workers_to_find_refuses_to_start():
    result = run_cli("router", "--port", "0")
    assert result.returncode == 2
    assert "no workers to route to" in result.stderr


def test_bad_router_flags_are_refused_with_a_message():
    result = run_cli("router", "--worker", "nohostport")
    assert result.returncode == 2 and "--worker must be host:port" in result.stderr
    result = run_cli("router", "--worker", "h:1", "--affinity-threshold", "2")
    assert result.returncode == 2 and "--affinity-threshold must be in [0, 1]" in result.stderr


def test_no_worker_serving_is_a_503_and_unavailable(tmp_path):
    dead = f"127.0.0.1:{free_port_run()}"  # nothing listens there
    router = start_router("router", [f"--worker={dead}"], tmp_path / "router.log")
    try:
        wait_for(lambda: health_status(router.base_url) == 503, timeout=60, what="the router")
        response = httpx.post(
            f"{router.base_url}/v1/completions", json={"model": "m", "prompt": "x"}, timeout=10
        )
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["type"] == "service_unavailable_error" and "no worker" in error["message"]
        with grpc.insecure_channel(f"127.0.0.1:{router.grpc_port}") as channel:
            stub = pb_grpc.RouterServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Complete(pb.CompleteRequest(model="m", text="x"), timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        router.process.stop()


def health_status(base_url: str) -> int | None:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return None
