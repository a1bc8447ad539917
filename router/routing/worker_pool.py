"""The workers a router may send to: a static list, the Redis registry, or both.

Registry workers come and go with their registration, with one exception:
a worker still SERVING is kept while it is missing from the registry (Redis
restarted and lost its data; the worker re-registers within seconds), so
a Redis outage never takes workers out of rotation. Health decides traffic;
the registry only adds workers and removes ones that are also gone.

One router serves one model: `--served-model-name`, or else the name the
first worker announces. Workers that announce another are left out (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from router.config import RouterConfig
from router.metrics import RouterMetrics
from router.routing.store import AffinityStore, StoreUnavailable
from router.routing.worker_handle import WorkerHandle
from shared.logging import get_logger
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

logger = get_logger(__name__)


class WorkerPool:
    def __init__(
        self,
        config: RouterConfig,
        store: AffinityStore,
        metrics: RouterMetrics,
        on_model_info: Callable[[wpb.GetModelInfoResponse], None],
    ) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._on_model_info = on_model_info
        self.model_name = config.served_model_name
        self._handles: dict[str, WorkerHandle] = {}  # by address
        self._refresh_task: asyncio.Task | None = None
        self._warned: set[str] = set()
        self.changed = asyncio.Event()

    async def start(self) -> None:
        for address in self._config.worker:
            self._add(address, None)
        if self._store.has_registry:
            await self._refresh_once()
        self._refresh_task = asyncio.create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            await asyncio.gather(self._refresh_task, return_exceptions=True)
        await asyncio.gather(*(h.close() for h in self._handles.values()))
        self._handles.clear()

    def serving(self) -> list[WorkerHandle]:
        """Workers that may take a request now, in address order."""
        return [
            h
            for _, h in sorted(self._handles.items())
            if h.is_serving and h.info is not None and h.info.served_model_name == self.model_name
        ]

    def _add(self, address: str, registry_id: str | None) -> None:
        handle = WorkerHandle(
            address,
            registry_id,
            self._config.load_interval,
            self._changed,
            self._config.worker_stall_timeout,
        )
        self._handles[address] = handle
        handle.start()
        logger.info("watching worker %s at %s", registry_id or "(static)", address)

    def _changed(self, handle: WorkerHandle) -> None:
        info = handle.info
        if info is not None:
            if self.model_name is None:
                self.model_name = info.served_model_name
                logger.info("serving model %r (announced by %s)", self.model_name, info.worker_id)
            if info.served_model_name == self.model_name:
                self._on_model_info(info)
            elif handle.address not in self._warned:
                self._warned.add(handle.address)
                logger.warning(
                    "worker %s at %s serves %r, not %r: leaving it out",
                    info.worker_id,
                    handle.address,
                    info.served_model_name,
                    self.model_name,
                )
        self.changed.set()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.discovery_interval)
            if not self._store.is_available:
                await self._store.probe()
            if self._store.has_registry and self._store.is_available:
                await self._refresh_once()

    async def _refresh_once(self) -> None:
        try:
            registered = {w.address: w for w in await self._store.live_workers()}
        except StoreUnavailable:
            return  # keep what we know
        for address, info in registered.items():
            if address not in self._handles:
                self._add(address, info.worker_id)
        for address, handle in list(self._handles.items()):
            gone = handle.registry_id is not None and address not in registered
            if gone and not handle.is_serving:
                logger.info("worker %s at %s left the registry", handle.worker_id, address)
                del self._handles[address]
                await handle.close()
                with contextlib.suppress(KeyError):
                    self._metrics.worker_in_flight.remove(handle.worker_id)
