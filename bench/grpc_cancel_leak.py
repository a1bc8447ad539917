"""Native memory a grpc.aio unary-stream call leaves behind, by how the caller ends it.

    python -m bench.grpc_cancel_leak [--calls 3000]

The router ends worker calls in each of these ways: a whole answer read to its
end, a stream left after its finish (cancelled between reads), and a client that
went away while the router waited for the next token. That last one is the leak:
grpcio frees a read's op array (and any message it had received) only when the
task awaiting the read consumes the read's event, so cancelling that task leaks
them (grpc/grpc#43360, open in grpcio 1.85). Cancelling the call and letting the
read end on its own frees everything: what router/routing/worker_stream.py does.

The server runs in a child process, so the figures are the client's alone:
glibc's in-use bytes (mallinfo2 uordblks) per call, after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import multiprocessing
import sys

import grpc

_SERVICE = "leak.Stream"


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def native_bytes_in_use() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    return libc.mallinfo2().uordblks


def _identity(message: bytes) -> bytes:
    return message


async def _three_then_silence(request: bytes, context) -> object:
    """Three responses, then none until cancelled: a worker between two tokens."""
    for _ in range(3):
        yield b"t" * 40
    await asyncio.sleep(3600)


async def _mute(request: bytes, context) -> object:
    """Nothing, not even headers, until cancelled: a worker that sent headers only with
    its first token, while its request waited in its queue."""
    await asyncio.sleep(3600)
    yield b""


async def _headers_then_mute(request: bytes, context) -> object:
    """Headers at once, then nothing: a Pagoda worker whose request waits in its queue."""
    await context.send_initial_metadata(())
    await asyncio.sleep(3600)
    yield b""


async def _three(request: bytes, context) -> object:
    for _ in range(3):
        yield b"t" * 40


def _serve(ports: multiprocessing.Queue) -> None:
    async def run() -> None:
        server = grpc.aio.server()
        handlers = {
            "Silent": grpc.unary_stream_rpc_method_handler(
                _three_then_silence, _identity, _identity
            ),
            "Three": grpc.unary_stream_rpc_method_handler(_three, _identity, _identity),
            "Mute": grpc.unary_stream_rpc_method_handler(_mute, _identity, _identity),
            "HeadersThenMute": grpc.unary_stream_rpc_method_handler(
                _headers_then_mute, _identity, _identity
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


async def _measure(port: int, num_calls: int) -> dict[str, float]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    options = {"request_serializer": _identity, "response_deserializer": _identity}
    silent = channel.unary_stream(f"/{_SERVICE}/Silent", **options)
    three = channel.unary_stream(f"/{_SERVICE}/Three", **options)
    mute = channel.unary_stream(f"/{_SERVICE}/Mute", **options)
    headers_then_mute = channel.unary_stream(f"/{_SERVICE}/HeadersThenMute", **options)

    async def read_to_the_end() -> None:
        call = three(b"r")
        while await call.read() is not grpc.aio.EOF:
            pass

    async def cancelled_between_reads() -> None:
        call = silent(b"r")
        for _ in range(3):
            await call.read()
        call.cancel()

    async def reader_task_cancelled() -> None:  # the router before the fix
        call = silent(b"r")
        for _ in range(3):
            await call.read()
        read = asyncio.ensure_future(call.read())
        await asyncio.sleep(0)  # the read is in flight
        read.cancel()
        await asyncio.gather(read, return_exceptions=True)

    async def cancel_with_a_read_in_flight(call, wait: float) -> None:
        read = asyncio.ensure_future(call.read())
        await asyncio.sleep(wait)  # the read is in flight
        call.cancel()
        await asyncio.gather(read, return_exceptions=True)

    async def call_cancelled_read_left_to_end() -> None:  # the router now
        call = silent(b"r")
        for _ in range(3):
            await call.read()
        await cancel_with_a_read_in_flight(call, 0)

    async def cancelled_before_any_headers() -> None:  # a worker that waits for a token
        await cancel_with_a_read_in_flight(mute(b"r"), 0.001)

    async def cancelled_after_headers() -> None:  # a worker that sends them at once
        await cancel_with_a_read_in_flight(headers_then_mute(b"r"), 0.001)

    ways = (
        read_to_the_end,
        cancelled_between_reads,
        reader_task_cancelled,
        call_cancelled_read_left_to_end,
        cancelled_before_any_headers,
        cancelled_after_headers,
    )
    result = {}
    for way in ways:
        for _ in range(300):  # warm: grpc's and the allocator's own caches
            await way()
        await asyncio.sleep(0.2)
        before = native_bytes_in_use()
        for _ in range(num_calls):
            await way()
        await asyncio.sleep(0.5)
        result[way.__name__] = round((native_bytes_in_use() - before) / num_calls, 1)
    await channel.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    server = context.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        result = asyncio.run(_measure(ports.get(timeout=60), args.calls))
    finally:
        server.kill()
    print(f"grpcio {grpc.__version__}: native bytes left per call ({args.calls} calls)")
    for way, grown in result.items():
        print(f"  {way:34s} {grown:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
