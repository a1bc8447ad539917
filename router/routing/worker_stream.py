"""One open Generate call: its first response, then the rest, with the worker's
in-flight accounting and the latency metrics kept on the way.

A call can be interrupted from outside: its worker hung (WorkerHandle's stall
rule; the request moves elsewhere) or the router is shutting down (the stream
ends with an error). The read in progress then raises that error.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc

from router.routing.policy import Decision
from router.routing.store import PromptHashes
from router.routing.worker_handle import WorkerHandle
from shared.errors import (
    CapacityError,
    InvalidRequestError,
    ModelNotFoundError,
    PagodaError,
    UnavailableError,
)
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

if TYPE_CHECKING:
    from router.metrics import RouterMetrics
    from router.routing.dispatcher import WorkerJob


class RequestTimeoutError(PagodaError):
    """The request ran past --request-timeout; its worker call was cancelled."""

    grpc_code = "DEADLINE_EXCEEDED"
    http_status = 504


# Why a stream's worker failed it, as the failover metric counts them.
DIED = "died"  # the connection broke: the process is gone, or the network between
STALLED = "stalled"  # silent past --worker-stall-timeout (WorkerHandle's stall rule)
UNAVAILABLE = "unavailable"  # the worker itself ended the call with an error status
FAILOVER_REASONS = (DIED, STALLED, UNAVAILABLE)


class WorkerFailedError(UnavailableError):
    """The worker failed after its first response: what it sent stands; the rest is
    generated elsewhere (Generation resumes it) or lost."""

    def __init__(self, message: str, reason: str = DIED) -> None:
        super().__init__(message)
        self.reason = reason


# What gRPC's client says when the transport broke under a call, rather than a
# status the worker sent (those carry the worker's own message).
_TRANSPORT_ERRORS = re.compile(
    r"socket closed|stream removed|connection reset|connection refused|broken pipe|"
    r"failed to connect|goaway|recvmsg|sendmsg|endpoint|transport",
    re.IGNORECASE,
)


def failure_reason(exc: grpc.aio.AioRpcError) -> str:
    """DIED when the connection broke, STALLED when its keepalive pings went
    unanswered (a hung worker, or the network to it), UNAVAILABLE when the worker
    ended the call with a status of its own (draining, engine failure).

    NOTE: both kinds come as an AioRpcError with the same code; only the details
    tell them apart (e.g. "Stream removed (Socket closed)" after a kill -9)."""
    details = exc.details() or ""
    if "keepalive" in details.lower():
        return STALLED
    return DIED if _TRANSPORT_ERRORS.search(details) else UNAVAILABLE


def error_from_rpc(exc: grpc.aio.AioRpcError) -> PagodaError:
    """A worker's status as the error it means (shared/errors.py)."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, message = details.partition(": ")
        return (
            InvalidRequestError(field, message)
            if message
            else InvalidRequestError("request", details)
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CapacityError(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return ModelNotFoundError(details)
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(details)
    return PagodaError(f"worker error ({code.name}): {details}")


class WorkerStream:
    def __init__(
        self,
        handle: WorkerHandle,
        decision: Decision,
        job: WorkerJob,
        num_prefill_tokens: int,
        metrics: RouterMetrics,
        on_end: Callable[[WorkerStream], None],
    ) -> None:
        self.handle = handle
        self.decision = decision
        self.job = job
        self._num_prefill_tokens = num_prefill_tokens
        self._metrics = metrics
        self._on_end = on_end
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._ticket: int | None = None
        self.first: wpb.GenerateResponse | None = None
        # Sample 0's tokens, so the router can record the blocks they fill.
        self.output_token_ids: list[int] = []
        self._last_token_at: float | None = None
        self.prompt_hashes: PromptHashes | None = None  # set by the dispatcher
        # Why the call was interrupted, and whether another worker may take it over.
        self._interrupted: PagodaError | None = None
        self._is_retryable = False

    @property
    def worker_id(self) -> str:
        return self.handle.worker_id

    @property
    def num_cached_tokens(self) -> int:
        return self.first.num_cached_tokens if self.first is not None else 0

    async def start(self, request: wpb.GenerateRequest) -> None:
        """Send the request and wait for the first response (raises AioRpcError)."""
        num_seqs = self.job.params.n if self.job.params.HasField("n") else 1
        self._ticket = self.handle.begin(self._num_prefill_tokens, num_seqs)
        self._gauge()
        self._call = self.handle.stub.Generate(request, timeout=self._time_left())
        self.handle.streams.add(self)
        try:
            first = await self._read()
        except BaseException as exc:  # a failure, or the client gave up waiting (cancelled)
            self.close()
            if exc is self._interrupted and self._is_retryable:
                # Like a worker that failed before its first token: the dispatcher retries.
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    details=str(exc),
                ) from None
            raise
        if first is grpc.aio.EOF:  # the worker closed the stream without a word
            self.close()
            raise self._call_error()
        self.handle.first_token(self._ticket)
        self.first = first
        self._observe(first)

    async def responses(self) -> AsyncIterator[wpb.GenerateResponse]:
        """The first response, then the rest; a failure here is the stream's end."""
        assert self.first is not None and self._call is not None, "not started"
        try:
            yield self.first
            while True:
                try:
                    response = await self._read()
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise self.timed_out_error() from exc
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        self.handle.mark_failed()
                    raise WorkerFailedError(
                        f"worker {self.worker_id} failed after the response started "
                        f"({exc.code().name}: {exc.details()}); the output is incomplete",
                        failure_reason(exc),
                    ) from exc
                if response is grpc.aio.EOF:
                    break
                self._observe(response)
                yield response
            self._on_end(self)
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the call if it is still open (the worker aborts the request)."""
        if self._call is not None and not self._call.done():
            self._call.cancel()
        self._finish()

    def interrupt(self, error: PagodaError, is_retryable: bool = False) -> None:
        """End the call from outside: the read in progress raises `error`."""
        if self._call is None or self._call.done() or self._interrupted is not None:
            return
        self._interrupted, self._is_retryable = error, is_retryable
        self._call.cancel()

    def interrupt_stalled(self, reason: str) -> None:
        """The worker hung: the request is to move to another one."""
        self.interrupt(WorkerFailedError(f"{reason}; the output is incomplete", STALLED), True)

    async def _read(self) -> wpb.GenerateResponse:
        assert self._call is not None
        # NOTE: the read runs in a task of its own that is never cancelled. grpcio
        # leaks the native op array of a read whose awaiting task is cancelled, and
        # the message if one had arrived (~100-140 bytes a time; grpc/grpc#43360):
        # with a third of the requests cancelled by their clients mid-stream, that
        # was the router's RSS growth. Cancelling the call instead ends the read at
        # once, and it frees its op (bench/grpc_cancel_leak.py measures both).
        read = asyncio.ensure_future(self._call.read())
        try:
            return await asyncio.shield(read)
        except (asyncio.CancelledError, grpc.aio.AioRpcError) as exc:
            task = asyncio.current_task()
            cancelled_here = isinstance(exc, asyncio.CancelledError) and (
                task is not None and task.cancelling()
            )
            if cancelled_here:  # the reader gave up: the read ends with the call
                read.add_done_callback(_retrieve)
                self._call.cancel()
            if self._interrupted is None or cancelled_here:
                raise
            raise self._interrupted from None

    def _time_left(self) -> float | None:
        """Seconds left of the request's --request-timeout (the call's deadline)."""
        if self.job.timeout is None:
            return None
        return max(self.job.arrival + self.job.timeout - time.monotonic(), 0.001)

    def timed_out_error(self) -> RequestTimeoutError:
        return RequestTimeoutError(
            f"the request ran longer than --request-timeout ({self.job.timeout:g} s); "
            "the output is incomplete"
        )

    def _observe(self, response: wpb.GenerateResponse) -> None:
        self.handle.heard()
        if not any(o.token_ids for o in response.outputs):
            return
        now = time.monotonic()
        if self._last_token_at is None:
            self._metrics.ttft.observe(now - self.job.arrival)
        else:
            self._metrics.itl.observe(now - self._last_token_at)
        self._last_token_at = now
        for output in response.outputs:
            if output.index == 0:
                self.output_token_ids.extend(output.token_ids)

    def _finish(self) -> None:
        self.handle.streams.discard(self)
        if self._ticket is not None:
            self.handle.end(self._ticket)
            self._ticket = None
            self._gauge()

    def _gauge(self) -> None:
        self._metrics.worker_in_flight.labels(self.worker_id).set(self.handle.num_in_flight)

    def _call_error(self) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="the worker ended the stream before any response",
        )


def _retrieve(read: asyncio.Future) -> None:
    """Take an abandoned read's outcome, so that asyncio does not log it as lost."""
    if not read.cancelled():
        read.exception()
