"""The event loop's side of the engine thread: one stream per Generate call.

A request gets an engine id of its own (a counter), so the caller's request
id may repeat, and deltas of a cancelled request can never reach a newer
stream that reuses its id.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from shared.errors import InvalidRequestError, UnavailableError
from shared.logging import get_logger
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.sampling_params import SamplingParams
from worker.engine.llm_engine import LLMEngine
from worker.service.convert import response_from_deltas
from worker.service.engine_loop import Batch, EngineLoop, Payload
from worker.service.load import LoadTracker

logger = get_logger(__name__)


class RequestStream:
    """One request's deltas, pushed by the hub, pulled as responses by its handler."""

    def __init__(self, engine_id: str, request_id: str, num_samples: int) -> None:
        self.engine_id = engine_id
        self.request_id = request_id
        self._queue: asyncio.Queue[Payload] = asyncio.Queue()
        self._num_unfinished = num_samples
        self._is_first = True

    @property
    def is_finished(self) -> bool:
        return self._num_unfinished == 0

    def push(self, payload: Payload) -> None:
        self._queue.put_nowait(payload)

    async def responses(self) -> AsyncIterator[pb.GenerateResponse]:
        """One response per engine step; a handler that fell behind gets the steps it
        missed merged into one, so a slow client never slows the engine."""
        while self._num_unfinished:
            payloads = [await self._queue.get()]
            while not self._queue.empty():
                payloads.append(self._queue.get_nowait())
            deltas = []
            for payload in payloads:
                if isinstance(payload, BaseException):
                    raise payload
                deltas.extend(payload)
            self._num_unfinished -= sum(d.finished for d in deltas)
            yield response_from_deltas(deltas, self._is_first)
            self._is_first = False


class RequestHub:
    def __init__(self, load: LoadTracker) -> None:
        self._load = load
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()
        self._idle = asyncio.Event()
        self._idle.set()
        self.engine: LLMEngine | None = None
        self.engine_loop: EngineLoop | None = None
        self.is_ready = False
        self.is_draining = False

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def attach(self, engine: LLMEngine, engine_loop: EngineLoop) -> None:
        self.engine, self.engine_loop = engine, engine_loop

    def open(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        cache_salt: bytes | None = None,
        grammar: Any = None,
        output_token_ids: list[int] | None = None,
    ) -> RequestStream:
        """Admit a request (or raise the error its caller gets) and start it."""
        if self.is_draining:
            raise UnavailableError("the worker is shutting down; send the request elsewhere")
        if not self.is_ready or self.engine is None or self.engine_loop is None:
            raise UnavailableError("the worker is still starting (loading the model)")
        if self.engine_loop.is_broken:
            raise UnavailableError("the worker's engine failed and cannot take requests")
        # Reads only immutable model facts, so it is safe beside the engine thread.
        self.engine.validate(prompt_token_ids, params, priority, output_token_ids or ())
        if params.n > self.engine_loop.max_waiting:
            # Each sample waits as a request of its own: this one could never be queued,
            # so retrying it (as a full queue's RESOURCE_EXHAUSTED invites) is futile.
            raise InvalidRequestError(
                "n",
                f"{params.n} samples can never wait here at once (--max-waiting "
                f"{self.engine_loop.max_waiting}); lower n",
            )
        engine_id = str(next(self._ids))
        stream = RequestStream(engine_id, request_id or f"req-{engine_id}", params.n)
        self._streams[engine_id] = stream
        self._changed()
        self.engine_loop.submit(
            engine_id, prompt_token_ids, params, priority, cache_salt, grammar, output_token_ids
        )
        return stream

    async def compile_grammar(self, params: SamplingParams) -> Any:
        """The request's grammar, compiled in the grammar threads while this handler
        waits and the engine keeps stepping; None when unconstrained. Raises the
        InvalidRequestError naming what does not compile, before any token."""
        if params.structured_outputs is None:
            return None
        if not self.is_ready or self.engine is None:
            raise UnavailableError("the worker is still starting (loading the model)")
        return await asyncio.wrap_future(self.engine.grammars.submit(params.structured_outputs))

    def close(self, stream: RequestStream) -> None:
        """The handler is done: abort what the engine still runs (cancel, deadline,
        disconnect, error), which frees its blocks."""
        if self._streams.pop(stream.engine_id, None) is None:
            return
        if not stream.is_finished and self.engine_loop is not None:
            logger.debug("request %s ended early: aborting it", stream.request_id)
            self.engine_loop.abort(stream.engine_id)
        self._changed()

    def deliver(self, batch: Batch) -> None:
        """Runs on the event loop, once per engine step."""
        streams = self._streams
        for engine_id, payload in batch:
            stream = streams.get(engine_id)
            if stream is not None:  # else its handler already left
                stream.push(payload)

    def fail_all(self, error: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream.push(error)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no stream is open; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _changed(self) -> None:
        self._load.num_active_streams = len(self._streams)
        if self._streams:
            self._idle.clear()
        else:
            self._idle.set()
