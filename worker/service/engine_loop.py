"""The engine's own thread: it alone touches the engine, stepping while there is work.

```
event loop ──submit/abort/call──► inbox (SimpleQueue) ──► engine thread
                                                              │ engine.step()
event loop ◄──call_soon_threadsafe(deliver, batch)────────────┘ once per step
```

Requests, aborts and calls reach the thread through one thread-safe queue, so
the event loop never waits on a step. Each step's results go back in one
batch of `(engine_id, payload)` pairs, where payload is the request's deltas
of this step or the exception that ended it. When nothing is running, the
thread blocks on the queue instead of spinning.

The thread also builds the engine: the thread that loads the weights is the one
that steps. OpenMP gives every thread that opens a parallel region its own team;
with a loading thread's team alive beside the stepping thread's, there are more
OpenMP threads than cores, libgomp stops spinning between regions, and each of a
step's ~200 kernel calls waits for its workers to wake. A 135M-parameter decode
step at one sequence took 14.1 ms that way against 7.0 on the loading thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from shared.errors import CapacityError, PagodaError
from shared.logging import get_logger
from shared.sampling_params import SamplingParams
from worker.engine.llm_engine import LLMEngine
from worker.executor import ExecutorFailure
from worker.kv_cache.block_pool import KVCacheEvent
from worker.outputs import RequestDelta
from worker.service.load import LoadTracker, queued_prefill_tokens
from worker.service.metrics import WorkerMetrics
from worker.service.stream_hold import StreamHold

logger = get_logger(__name__)

Payload = list[RequestDelta] | BaseException
Batch = list[tuple[str, Payload]]


class EngineFailure(PagodaError):
    """A step raised; every request in the engine at that moment is failed."""


@dataclass
class _Add:
    engine_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    cache_salt: bytes | None
    output_token_ids: list[int]
    grammar: Any = None


@dataclass
class _Abort:
    engine_id: str


@dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    future: Future


@dataclass
class _Failed:
    error: ExecutorFailure


_STOP = object()


class EngineLoop:
    def __init__(
        self,
        build: Callable[[], LLMEngine],
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[Batch], None],
        load: LoadTracker,
        max_waiting: int,
        on_kv_events: Callable[[Sequence[KVCacheEvent]], None] | None = None,
        stream_interval: int = 1,
    ) -> None:
        self._build = build
        self.engine: LLMEngine | None = None
        # The engine, once built on the engine thread (or the exception building it raised).
        self.ready: Future = Future()
        self._loop = loop
        self._deliver = deliver
        self._load = load
        self.max_waiting = max_waiting
        self.on_kv_events = on_kv_events  # set before requests arrive; read between steps
        self.metrics: WorkerMetrics | None = None  # likewise
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: Batch = []
        # engine id -> samples not finished yet
        self._unfinished: dict[str, int] = {}
        self._hold = StreamHold(stream_interval)
        self._stopping = False
        self._is_load_stale = False
        # Set when a failed step left the engine in a state it cannot vouch for.
        self.is_broken = False
        # Set when the model's ranks are gone: the worker must stop (server.py).
        self.fatal_error: ExecutorFailure | None = None
        self._is_fatal_unreported = False
        self._thread = threading.Thread(target=self._run, name="pagoda-engine", daemon=True)

    # ---- called from other threads --------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(
        self,
        engine_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        cache_salt: bytes | None = None,
        grammar: Any = None,
        output_token_ids: list[int] | None = None,
    ) -> None:
        self._inbox.put(
            _Add(
                engine_id,
                prompt_token_ids,
                params,
                priority,
                cache_salt,
                output_token_ids or [],
                grammar,
            )
        )

    def abort(self, engine_id: str) -> None:
        self._inbox.put(_Abort(engine_id))

    def call(self, fn: Callable[[LLMEngine], Any]) -> Future:
        """Run `fn(engine)` on the engine thread between steps; its result comes back
        in the returned future."""
        future: Future = Future()
        self._inbox.put(_Call(fn, future))
        return future

    def stop(self, timeout: float | None = None) -> None:
        self._inbox.put(_STOP)
        if self._thread.ident is not None:  # started
            self._thread.join(timeout)

    # ---- the engine thread -------------------------------------------------------

    def _run(self) -> None:
        try:
            engine = self.engine = self._build()
        except BaseException as exc:
            self.ready.set_exception(exc)
            return
        engine.core.executor.on_failure = lambda error: self._inbox.put(_Failed(error))
        self.ready.set_result(engine)
        try:
            self._serve(engine)
        finally:
            engine.shutdown()

    def _serve(self, engine: LLMEngine) -> None:
        while not self._stopping:
            if not engine.has_unfinished_requests():
                self._handle(self._inbox.get())  # idle: block until there is news
            while not self._stopping:
                try:
                    command = self._inbox.get_nowait()
                except queue.Empty:
                    break
                self._handle(command)
            if self._stopping:
                break
            if engine.has_unfinished_requests():
                self._step()
            elif self._is_load_stale:  # e.g. the last request was aborted: no step follows
                stats = engine.core.scheduler.make_stats()
                self._load.record_step(stats, 0, 0)
                if self.metrics is not None:
                    self.metrics.idle(stats)
            self._is_load_stale = False
            self._flush()

    def _handle(self, command: object) -> None:
        if command is _STOP:
            self._stopping = True
        elif isinstance(command, _Add):
            self._add(command)
        elif isinstance(command, _Abort):
            self._hold.close(command.engine_id)
            if self._unfinished.pop(command.engine_id, None) is not None:
                self.engine.abort_request(command.engine_id)
                self._is_load_stale = True
                if self.metrics is not None:
                    self.metrics.aborted(command.engine_id)
        elif isinstance(command, _Failed):
            self._fail_all(command.error)
        elif isinstance(command, _Call):
            try:
                command.future.set_result(command.fn(self.engine))
            except BaseException as exc:
                command.future.set_exception(exc)

    def _add(self, command: _Add) -> None:
        num_waiting = len(self.engine.core.scheduler.waiting)
        if num_waiting + command.params.n > self.max_waiting:
            self._outbox.append(
                (
                    command.engine_id,
                    CapacityError(
                        f"the waiting queue is full ({num_waiting} waiting, --max-waiting "
                        f"{self.max_waiting}); retry later or on another worker"
                    ),
                )
            )
            return
        try:
            self.engine.add_request(
                command.engine_id,
                command.prompt_token_ids,
                command.params,
                priority=command.priority,
                cache_salt=command.cache_salt,
                grammar=command.grammar,
                output_token_ids=command.output_token_ids,
            )
        except Exception as exc:  # validated before, so this is rare; the stream gets it
            self._outbox.append((command.engine_id, exc))
            return
        self._unfinished[command.engine_id] = command.params.n
        self._hold.open(command.engine_id, command.params.stream_interval)
        if self.metrics is not None:
            self.metrics.added(command.engine_id, command.params.n)

    def _step(self) -> None:
        started = time.monotonic()
        try:
            output = self.engine.step()
        except Exception as exc:
            self._fail_all(exc)
            return
        by_request: dict[str, list[RequestDelta]] = {}
        num_output_tokens = 0
        for delta in output.deltas:
            by_request.setdefault(delta.request_id, []).append(delta)
            num_output_tokens += len(delta.new_token_ids)
            if delta.finished:
                left = self._unfinished.get(delta.request_id, 1) - 1
                if left > 0:
                    self._unfinished[delta.request_id] = left
                else:
                    self._unfinished.pop(delta.request_id, None)
        for engine_id, deltas in by_request.items():
            ready = self._hold.offer(engine_id, deltas)
            if ready is not None:
                self._outbox.append((engine_id, ready))
            if engine_id not in self._unfinished:
                self._hold.close(engine_id)
        self._load.record_step(
            output.stats, num_output_tokens, queued_prefill_tokens(self.engine.core.scheduler)
        )
        if output.kv_events and self.on_kv_events is not None:
            self.on_kv_events(output.kv_events)
        if self.metrics is not None:
            self.metrics.stepped(started, output, self.engine.core.scheduler)

    def _fail_all(self, exc: Exception) -> None:
        """A failed step fails every request in the engine, frees their blocks, and
        keeps serving if the block pool is still sound."""
        if isinstance(exc, ExecutorFailure):
            # The ranks are gone: nothing can step again. UNAVAILABLE, so the router
            # retries elsewhere; the server stops the worker.
            logger.error("%s; failing %d requests", exc, len(self._unfinished))
            self.fatal_error = exc
            self.is_broken = self._is_fatal_unreported = True
            for engine_id in self._unfinished:
                self._hold.close(engine_id)
                self._outbox.append((engine_id, exc))
                self.engine.abort_request(engine_id)  # the scheduler's side only
            self._unfinished.clear()
            return
        logger.exception("engine step failed; failing %d requests", len(self._unfinished))
        error = EngineFailure(f"engine step failed: {type(exc).__name__}: {exc}")
        for engine_id in list(self._unfinished):
            self._hold.close(engine_id)
            self._outbox.append((engine_id, error))
        try:
            for engine_id in list(self._unfinished):
                self.engine.abort_request(engine_id)
                if self.metrics is not None:
                    self.metrics.aborted(engine_id)
            self.engine.core.scheduler.kv.pool.check_integrity()
            if self.engine.has_unfinished_requests():
                raise RuntimeError("requests left in the engine after aborting all of them")
        except Exception:
            logger.exception("the engine could not recover; refusing new requests")
            self.is_broken = True
        self._unfinished.clear()
        stats = self.engine.core.scheduler.make_stats()
        self._load.record_step(stats, 0, 0)

    def _flush(self) -> None:
        # A fatal error goes out even with no stream to end: the server stops on it.
        if not self._outbox and not self._is_fatal_unreported:
            return
        self._is_fatal_unreported = False
        batch, self._outbox = self._outbox, []
        # RuntimeError: the event loop closed under us while shutting down.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._deliver, batch)
