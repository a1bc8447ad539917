"""The fault table (docs/FAULTS.md): each fault under steady traffic (8 clients,
streamed and whole, greedy and seeded) against real processes, with the figures
every row reports: sent, completed, ended with a clear error, lost (0), hung (0).
Set PAGODA_FAULT_TABLE=path to append each row there as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
import time

import grpc
import httpx
import pytest

from shared.ports import free_port_run
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as wpb_grpc
from tests.cluster import PagodaProcess, start_router, start_worker, stop_all, wait_serving
from tests.conftest import wait_for
from tests.faults.traffic import Traffic
from tests.router.conftest import API_KEY, MODEL

pytestmark = pytest.mark.slow  # each row runs its own processes for ~20-40 s


def report(fault: str, traffic: Traffic, **extra) -> dict:
    row = {"fault": fault, "sent": traffic.num_sent, **dict(traffic.outcomes), **extra}
    for key in ("completed", "error", "lost", "hung"):
        row.setdefault(key, 0)
    print(json.dumps(row))
    if path := os.environ.get("PAGODA_FAULT_TABLE"):
        with open(path, "a") as out:
            out.write(json.dumps(row) + "\n")
    return row


def run_traffic(base_url: str, fault, seconds_before: float = 2.0, seconds_after: float = 4.0):
    traffic = Traffic(base_url, API_KEY)
    traffic.warm_up()
    traffic.start()
    time.sleep(seconds_before)
    fault()
    time.sleep(seconds_after)
    traffic.stop()
    return traffic


def worker_load(address: str) -> wpb.GetLoadResponse:
    with grpc.insecure_channel(address) as channel:
        return wpb_grpc.WorkerServiceStub(channel).GetLoad(wpb.GetLoadRequest(), timeout=10)


def test_sigkill_of_a_worker_under_traffic(make_fault_serve):
    with make_fault_serve() as serve:
        victim = sorted(serve.pids)[0]
        traffic = run_traffic(
            serve.served.base_url, lambda: os.kill(serve.pids[victim], signal.SIGKILL)
        )
    row = report("SIGKILL of a worker mid-stream", traffic)
    assert row["lost"] == row["hung"] == row["error"] == 0 and row["completed"] > 20


def test_sigstop_then_sigcont_of_a_worker_under_traffic(make_fault_serve):
    with make_fault_serve() as serve:
        victim = serve.pids[sorted(serve.pids)[0]]

        def hang() -> None:
            os.kill(victim, signal.SIGSTOP)
            threading.Timer(8.0, os.kill, (victim, signal.SIGCONT)).start()

        traffic = run_traffic(serve.served.base_url, hang, seconds_after=12.0)
    row = report("SIGSTOP of a worker (8 s), then SIGCONT", traffic)
    assert row["lost"] == row["hung"] == row["error"] == 0 and row["completed"] > 20


def test_sigterm_of_a_worker_under_traffic(make_fault_serve):
    with make_fault_serve() as serve:
        victim = serve.pids[sorted(serve.pids)[0]]
        traffic = run_traffic(serve.served.base_url, lambda: os.kill(victim, signal.SIGTERM))
    row = report("SIGTERM of a worker (drain)", traffic)
    assert row["lost"] == row["hung"] == row["error"] == 0 and row["completed"] > 20


class CuttableProxy:
    """A TCP proxy on loopback in front of a worker; cut() resets every connection
    through it and refuses new ones for `down_s`."""

    def __init__(self, target_port: int) -> None:
        self.port, self._target = free_port_run(), target_port
        self._down_until = 0.0
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            if time.monotonic() < self._down_until:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:  # the worker is not listening (yet)
                client.close()
                continue
            self._sockets |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self, down_s: float) -> None:
        self._down_until = time.monotonic() + down_s
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.close()  # RST, as a dropped network path looks to the peers
        self._sockets.clear()


def _worker_port(process: PagodaProcess) -> int:
    return int(next(a for a in process.process.args if a.startswith("--port=")).split("=")[1])


@pytest.fixture
def router_and_workers(make_checkpoint, tmp_path):
    """Two `pagoda worker` processes; the test starts routers over them."""
    model = make_checkpoint("llama")
    workers = [
        start_worker(model, [f"--served-model-name={MODEL}"], tmp_path / f"worker-{i}.log")
        for i in range(2)
    ]
    yield workers, tmp_path
    stop_all(workers)


def test_network_resets_between_router_and_a_worker_under_traffic(router_and_workers):
    workers, tmp_path = router_and_workers
    ports = [_worker_port(w) for w in workers]
    proxy = CuttableProxy(ports[0])
    flags = [f"--worker=127.0.0.1:{proxy.port}", f"--worker=127.0.0.1:{ports[1]}"]
    flags += [f"--api-key={API_KEY}", "--load-interval=0.2", "--worker-stall-timeout=3"]
    router = start_router("router", flags, tmp_path / "router.log")
    try:
        wait_serving(router.process, router.base_url, 2)
        traffic = run_traffic(router.base_url, lambda: proxy.cut(down_s=3.0), seconds_after=6.0)
    finally:
        router.process.stop()
    row = report("TCP resets between router and a worker (3 s down)", traffic)
    assert row["lost"] == row["hung"] == row["error"] == 0 and row["completed"] > 20


def test_router_killed_and_restarted_under_traffic(router_and_workers):
    workers, tmp_path = router_and_workers
    addresses = [f"127.0.0.1:{_worker_port(w)}" for w in workers]
    port, grpc_port = free_port_run(), free_port_run()
    flags = [f"--worker={a}" for a in addresses] + [f"--api-key={API_KEY}"]
    flags += ["--host=127.0.0.1", f"--port={port}", f"--grpc-port={grpc_port}"]
    routers = [PagodaProcess("router", flags, tmp_path / "router-0.log")]
    base_url = f"http://127.0.0.1:{port}"
    wait_serving(routers[0], base_url, 2)

    def kill_and_restart() -> None:
        routers[0].process.kill()
        routers[0].process.wait(10)
        routers.append(PagodaProcess("router", flags, tmp_path / "router-1.log"))

    try:
        traffic = run_traffic(base_url, kill_and_restart, seconds_after=1.0)
        wait_serving(routers[-1], base_url, 2)
        # Every retry (each client's next requests) succeeds once the new router serves.
        after = Traffic(base_url, API_KEY)
        after.start()
        time.sleep(3.0)
        after.stop()
    finally:
        stop_all(routers)
    # The workers aborted what the dead router had open: their pools are empty again.
    for address in addresses:
        wait_for(lambda a=address: worker_load(a).num_kv_blocks_used == 0, timeout=10)
        assert worker_load(address).num_active_streams == 0
    row = report(
        "router SIGKILL, restarted", traffic, retried=after.num_sent,
        retried_completed=after.outcomes["completed"],
    )  # fmt: skip
    assert row["lost"] == row["hung"] == 0 and row["error"] >= 1
    assert after.outcomes["completed"] == after.num_sent > 10


def test_a_hundred_clients_leaving_mid_stream_leave_no_kv_blocks(make_fault_serve):
    with make_fault_serve() as serve:
        served = serve.served
        body = {
            "model": MODEL, "prompt": "leave early", "max_tokens": 200, "ignore_eos": True,
            "stream": True,
        }  # fmt: skip

        async def leave(client: httpx.AsyncClient) -> None:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        return  # disconnect after the first chunk

        async def scenario() -> None:
            async with httpx.AsyncClient(
                base_url=served.base_url, headers=served.headers, timeout=60
            ) as client:
                await asyncio.gather(*(leave(client) for _ in range(100)))

        asyncio.run(scenario())
        addresses = [f"127.0.0.1:{w.rsplit('-', 1)[1]}" for w in serve.pids]
        for address in addresses:
            wait_for(lambda a=address: worker_load(a).num_kv_blocks_used == 0, timeout=15)
            assert worker_load(address).num_active_streams == 0
    print(json.dumps({"fault": "100 clients disconnecting mid-stream", "kv_blocks_left": 0}))


def test_redis_killed_and_restarted_under_traffic(make_checkpoint, tmp_path):
    from tests.redis_server import RedisServer

    if not RedisServer.available():
        pytest.skip("needs a redis-server binary")
    redis = RedisServer()
    redis.start()
    store = [f"--redis-url={redis.url}", "--redis-prefix=faults"]
    model = make_checkpoint("llama")
    workers = [
        start_worker(
            model,
            [*store, f"--worker-id=w{i}", f"--served-model-name={MODEL}", "--heartbeat-ttl=2"],
            tmp_path / f"worker-{i}.log",
        )
        for i in range(2)
    ]
    router = start_router(
        "router", [*store, f"--api-key={API_KEY}", "--load-interval=0.2"], tmp_path / "router.log"
    )
    try:
        wait_serving(router.process, router.base_url, 2)

        def outage() -> None:
            redis.stop()
            time.sleep(4.0)
            redis.start()

        traffic = run_traffic(router.base_url, outage, seconds_after=4.0)
    finally:
        stop_all([router.process, *workers])
        redis.stop()
    row = report("Redis killed for 4 s, then restarted", traffic)
    assert row["lost"] == row["hung"] == row["error"] == 0 and row["completed"] > 20
