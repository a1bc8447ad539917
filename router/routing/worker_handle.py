"""One worker as a router sees it: its channel, what it serves, whether it is
SERVING, how loaded it is, and what this router has sent it lately.

Two tasks keep it current:

* **watch**: GetModelInfo, then the gRPC health Watch stream. A worker that
  drains says NOT_SERVING at once; one that dies breaks the stream at once.
  Either way it gets no more traffic until a new watch finds it SERVING.
* **load**: GetLoad every `--load-interval`.

A worker that hangs without closing its connection (SIGSTOP, a stuck host) is
caught by time, not by counting missed polls: when nothing was heard from it (no
load report, no health news, no token on any stream) for `--worker-stall-timeout`,
it counts as not serving and its open streams are interrupted, to be resumed
elsewhere. A busy worker whose polls are slow keeps streaming tokens, so it is not
taken for dead. HTTP/2 keepalive pings catch a dead peer the kernel never told us
about (a host that vanished).

Its load is the last report corrected by this router's own requests since
(routing/load_estimate.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.routing.load_estimate import LoadEstimate
from router.routing.store import WorkerKey
from shared.block_hash import BLOCK_HASH_SCHEME
from shared.logging import get_logger
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as wpb_grpc

logger = get_logger(__name__)

MAX_MESSAGE_BYTES = 64 * 2**20  # as the worker allows: prompt logprobs of long prompts
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect fast after a worker restarts on the same address.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # The worker's server permits these pings (worker/service/server.py).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
_SERVING = health_pb2.HealthCheckResponse.SERVING


class WorkerHandle:
    def __init__(
        self,
        address: str,
        registry_id: str | None,
        load_interval: float,
        on_change: Callable[[WorkerHandle], None],
        stall_timeout: float = 15.0,
    ) -> None:
        self.address = address
        self.registry_id = registry_id  # the id the Redis registry lists it under; None: static
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = wpb_grpc.WorkerServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._load_interval = load_interval
        self._stall_timeout = stall_timeout
        self._on_change = on_change
        self.last_heard = time.monotonic()
        # The open streams (WorkerStream), interrupted when the worker hangs.
        self.streams: set = set()
        self.info: wpb.GetModelInfoResponse | None = None
        self.is_serving = False
        self.load = LoadEstimate()
        self.num_in_flight = 0
        self.num_sent = 0
        self._watch_task: asyncio.Task | None = None
        self._load_task: asyncio.Task | None = None

    @property
    def worker_id(self) -> str:
        return self.info.worker_id if self.info else (self.registry_id or self.address)

    @property
    def key(self) -> WorkerKey:
        info = self.info
        assert info is not None, "no model info yet"
        return WorkerKey(
            info.worker_id,
            info.epoch,
            info.block_size,
            info.enable_prefix_caching and info.block_hash_scheme == BLOCK_HASH_SCHEME,
        )

    def start(self) -> None:
        self._watch_task = asyncio.create_task(self._watch())
        self._load_task = asyncio.create_task(self._poll_load())

    async def close(self) -> None:
        tasks = [t for t in (self._watch_task, self._load_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._set_serving(False)
        await self.channel.close()

    # ---- what this router sends it ----------------------------------------------

    def begin(self, num_prefill_tokens: int, num_seqs: int) -> int:
        self.num_in_flight += 1
        self.num_sent += 1
        return self.load.sent(num_prefill_tokens, num_seqs, time.monotonic())

    def first_token(self, ticket: int) -> None:
        self.load.first_token(ticket, time.monotonic())

    def end(self, ticket: int) -> None:
        self.load.ended(ticket, time.monotonic())
        self.num_in_flight -= 1

    def heard(self) -> None:
        """The worker said something (a report, health news, a token): it is alive."""
        self.last_heard = time.monotonic()

    def mark_failed(self) -> None:
        """A call failed as if the worker were gone: no traffic until a fresh health
        watch finds it SERVING (the watch only speaks on changes, so restart it)."""
        self._set_serving(False)
        if self._watch_task is not None:
            self._watch_task.cancel()
        self._watch_task = asyncio.create_task(self._watch())

    # ---- keeping current -----------------------------------------------------------

    def _set_serving(self, is_serving: bool) -> None:
        if is_serving != self.is_serving:
            self.is_serving = is_serving
            logger.info(
                "worker %s at %s is %s",
                self.worker_id,
                self.address,
                "SERVING" if is_serving else "not serving",
            )
            self._on_change(self)

    async def _watch(self) -> None:
        backoff = 0.1
        while True:
            try:
                info = await self.stub.GetModelInfo(wpb.GetModelInfoRequest(), timeout=5)
                self.heard()
                if self.info is None or info.epoch != self.info.epoch:
                    self.info, self.load = info, LoadEstimate()
                    self._on_change(self)
                watch = self._health.Watch(health_pb2.HealthCheckRequest(service=""))
                try:
                    async for status in watch:
                        self.heard()
                        self._set_serving(status.status == _SERVING)
                        backoff = 0.1
                finally:  # also when mark_failed() cancels this task
                    watch.cancel()
            except grpc.aio.AioRpcError as exc:
                logger.debug("worker %s: %s", self.address, exc.details())
            self._set_serving(False)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def _poll_load(self) -> None:
        while True:
            await asyncio.sleep(self._load_interval)
            if self.info is None:
                continue
            asked_at = time.monotonic()
            try:
                report = await self.stub.GetLoad(
                    wpb.GetLoadRequest(), timeout=max(1.0, 2 * self._load_interval)
                )
            except grpc.aio.AioRpcError:
                self._check_stalled()
                continue
            self.heard()
            self.load.update(report, asked_at)

    def _check_stalled(self) -> None:
        silent = time.monotonic() - self.last_heard
        if silent <= self._stall_timeout or not (self.is_serving or self.streams):
            return
        logger.warning(
            "worker %s at %s sent nothing for %.1f s (--worker-stall-timeout %g); "
            "not routing to it, moving its %d open streams",
            self.worker_id,
            self.address,
            silent,
            self._stall_timeout,
            len(self.streams),
        )
        self.mark_failed()
        reason = (
            f"worker {self.worker_id} sent nothing for {silent:.1f} s "
            f"(--worker-stall-timeout {self._stall_timeout:g})"
        )
        for stream in list(self.streams):
            stream.interrupt_stalled(reason)
