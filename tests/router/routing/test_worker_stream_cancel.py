"""A WorkerStream whose reader is cancelled mid-read (the client went away while
its worker was generating) leaves no native memory behind, and the worker call is
cancelled; against a real gRPC worker front in this process that sends three
responses and then stays silent, as a worker between two tokens does.

NOTE: grpcio leaks a read's op array (and any message it had received) when the
task awaiting the read is cancelled (grpc/grpc#43360): ~100 bytes a request, the
router's RSS growth in the 30-minute soak. The native heap is read with glibc's
mallinfo2(); Python objects live in pymalloc's own mmapped arenas, outside it."""

from __future__ import annotations

import asyncio
import platform
import time

import grpc
import pytest

from bench.grpc_cancel_leak import native_bytes_in_use
from router.metrics import RouterMetrics
from router.routing.dispatcher import WorkerJob
from router.routing.policy import Decision
from router.routing.worker_handle import WorkerHandle
from router.routing.worker_stream import WorkerStream
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as wpb_grpc


class SilentWorker(wpb_grpc.WorkerServiceServicer):
    """Three responses, then nothing until the call is cancelled."""

    def __init__(self) -> None:
        self.num_cancelled = 0

    async def Generate(self, request, context):
        for i in range(3):
            yield wpb.GenerateResponse(outputs=[wpb.SampleOutput(index=0, token_ids=[i + 1])])
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.num_cancelled += 1
            raise


async def _open(handle: WorkerHandle, metrics: RouterMetrics, i: int) -> WorkerStream:
    job = WorkerJob(f"r{i}", [1, 2, 3], sampling_pb2.SamplingParams(max_tokens=8))
    stream = WorkerStream(handle, Decision("w", "load", 0, 0), job, 3, metrics, lambda s: None)
    await stream.start(wpb.GenerateRequest(request_id=job.request_id, prompt_token_ids=[1, 2, 3]))
    return stream


async def _read_until_cancelled(stream: WorkerStream, got_three: asyncio.Event) -> None:
    num = 0
    async for _ in stream.responses():
        num += 1
        if num == 3:
            got_three.set()  # the next read waits for a token that never comes


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallinfo2 is glibc's")
def test_a_reader_cancelled_mid_read_leaves_no_native_memory_and_cancels_the_call():
    async def scenario() -> tuple[float, int, int]:
        server, worker = grpc.aio.server(), SilentWorker()
        wpb_grpc.add_WorkerServiceServicer_to_server(worker, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        handle = WorkerHandle(f"127.0.0.1:{port}", None, 1.0, lambda h: None)
        metrics = RouterMetrics()

        async def one(i: int) -> None:
            # (the load polls a started handle would make prune its per-request records)
            handle.load.update(wpb.GetLoadResponse(), time.monotonic())
            stream = await _open(handle, metrics, i)
            got_three = asyncio.Event()
            reader = asyncio.create_task(_read_until_cancelled(stream, got_three))
            await got_three.wait()
            await asyncio.sleep(0)  # the fourth read is in flight
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

        try:
            for i in range(200):  # warm: grpc's and the allocator's own caches
                await one(i)
            await asyncio.sleep(0.2)
            before, num_calls = native_bytes_in_use(), 2000
            for i in range(num_calls):
                await one(i)
            await asyncio.sleep(0.5)
            grown = (native_bytes_in_use() - before) / num_calls
            return grown, worker.num_cancelled, handle.num_in_flight
        finally:
            await handle.close()
            await server.stop(None)

    grown, num_cancelled, num_in_flight = asyncio.run(scenario())
    # Before the fix: ~97 bytes a call (the op array of each abandoned read).
    assert grown < 20, f"{grown:.1f} native bytes left behind per cancelled stream"
    assert num_cancelled >= 2000  # every worker call was cancelled, none left open
    assert num_in_flight == 0
