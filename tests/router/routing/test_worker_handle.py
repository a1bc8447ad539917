"""WorkerHandle's liveness rule, against a real gRPC worker front in this process whose
load polls all fail: a worker that still streams tokens stays in rotation however
many polls it misses; one silent for --worker-stall-timeout is taken out, and its
open streams are interrupted. (This one answers its health watch, so it comes back
at once; a hung process does not.)"""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from router.routing.worker_handle import WorkerHandle
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as wpb_grpc


class BusyWorker(wpb_grpc.WorkerServiceServicer):
    """Announces a model; every GetLoad fails, as polls of an overloaded host do."""

    def __init__(self) -> None:
        self.num_polls = 0

    async def GetModelInfo(self, request, context):
        return wpb.GetModelInfoResponse(worker_id="busy", epoch=1, block_size=4)

    async def GetLoad(self, request, context):
        self.num_polls += 1
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "too busy to answer")


class OpenStream:
    def __init__(self) -> None:
        self.reason: str | None = None

    def interrupt_stalled(self, reason: str) -> None:
        self.reason = reason


def test_missed_polls_are_tolerated_while_tokens_flow_and_silence_is_not():
    async def scenario() -> None:
        server, worker = grpc.aio.server(), BusyWorker()
        wpb_grpc.add_WorkerServiceServicer_to_server(worker, server)
        health_servicer = health.aio.HealthServicer()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        changes: list[tuple[float, bool]] = []

        def on_change(h: WorkerHandle) -> None:
            changes.append((time.monotonic(), h.is_serving))

        handle = WorkerHandle(f"127.0.0.1:{port}", None, 0.05, on_change, stall_timeout=0.6)
        stream = OpenStream()
        handle.streams.add(stream)
        handle.start()
        try:
            while not handle.is_serving:
                await asyncio.sleep(0.01)
            changes.clear()  # (its model info and first health news)
            busy_until = time.monotonic() + 1.5
            while time.monotonic() < busy_until:  # tokens arrive every 0.1 s
                handle.heard()
                await asyncio.sleep(0.1)
            assert worker.num_polls >= 10  # all missed...
            assert handle.is_serving and stream.reason is None  # ...and it still serves
            assert changes == []
            silent_since = handle.last_heard
            while stream.reason is None:
                await asyncio.sleep(0.01)
            dropped_at = next(t for t, serving in changes if not serving)
            assert 0.6 <= dropped_at - silent_since < 3.0, dropped_at - silent_since
            assert (
                "sent nothing for" in stream.reason
                and "--worker-stall-timeout 0.6" in stream.reason
            )
        finally:
            await handle.close()
            await server.stop(0)

    asyncio.run(scenario())
