"""A worker server on an event loop thread of its own, for embedding a worker in
another program (benchmarks, tests, a one-machine launcher) without subprocesses.

Signals are not handled here: the embedding program owns them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.service.config import WorkerServiceConfig
from worker.service.server import WorkerServer

T = TypeVar("T")


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class BackgroundWorker:
    def __init__(self, engine_config: EngineConfig, config: WorkerServiceConfig) -> None:
        self.loop = _new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="pagoda-worker-loop", daemon=True
        )
        self.server = WorkerServer(engine_config, config)

    @property
    def address(self) -> str:
        """Where a client on this machine dials it (the bound port, on loopback)."""
        return f"127.0.0.1:{self.server.port}"

    @property
    def engine(self) -> LLMEngine:
        assert self.server.engine is not None, "not started"
        return self.server.engine

    def start(self, timeout: float = 600.0) -> BackgroundWorker:
        self._thread.start()
        self.run(self.server.start(), timeout)
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        """Run a coroutine on the worker's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_engine(self, fn: Callable[[LLMEngine], T], timeout: float | None = 60.0) -> T:
        """Run fn(engine) on the engine thread, between steps."""
        assert self.server.engine_loop is not None, "not started"
        return self.server.engine_loop.call(fn).result(timeout)

    def stop(self, drain_timeout: float | None = None) -> None:
        """Drain for `drain_timeout` seconds (None: stop at once), then stop everything."""
        if self._thread.is_alive():
            if drain_timeout is None:
                self.run(self.server.stop())
            else:
                self.run(self.server.drain_and_stop(drain_timeout), drain_timeout + 60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        if not self.loop.is_running():
            self.loop.close()
