"""The router's lifecycle: one event loop serving HTTP (uvicorn) and gRPC side by side.

```
start()  store (Redis, or in-process) -> worker pool (static list, registry; health
         watches) -> HTTP on --port, gRPC on --grpc-port. The tokenizer loads, in a
         thread, when the first worker of the model announces itself; until then
         requests get 503 and /health says why.
stop()   gRPC health NOT_SERVING -> stop taking connections -> open requests get
         --shutdown-timeout to finish; those still open then end with an error (an
         SSE error event after finish_reason "abort", a 503, UNAVAILABLE) -> close
         worker channels and the store
```
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from router.config import RouterConfig
from router.grpc_front import SERVICE_NAME, RouterServicer
from router.metrics import RouterMetrics
from router.model import ModelContext
from router.openai.app import build_app
from router.routing.dispatcher import Dispatcher
from router.routing.redis_store import RedisStore
from router.routing.store import AffinityStore, LocalStore
from router.routing.worker_pool import WorkerPool
from router.state import RouterState
from shared.errors import ConfigError, UnavailableError
from shared.logging import get_logger
from shared.proto.pagoda.v1 import router_pb2_grpc as pb_grpc
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

logger = get_logger(__name__)

_HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_END_MARGIN_S = 2


class _Uvicorn(uvicorn.Server):
    """uvicorn inside our event loop: the process owns the signals, not uvicorn."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return None

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host.strip("[]"), port), family=family)


class RouterServer:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.metrics = RouterMetrics()
        self.store: AffinityStore = (
            RedisStore(config.redis_url, config.redis_prefix) if config.redis_url else LocalStore()
        )
        self.pool = WorkerPool(config, self.store, self.metrics, self._on_model_info)
        self.dispatcher = Dispatcher(config, self.pool, self.store, self.metrics)
        self.state = RouterState(config, self.metrics, self.pool, self.dispatcher)
        self.health = health.aio.HealthServicer()
        self.http_port = 0
        self.grpc_port = 0
        self._http: _Uvicorn | None = None
        self._http_task: asyncio.Task | None = None
        self._grpc: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._is_loading_model = False

    async def start(self) -> None:
        # Read when scraped, so they are never stale.
        self.metrics.store_up.labels(self.store.name).set_function(
            lambda: float(self.store.is_available)
        )
        self.metrics.workers_serving.set_function(lambda: float(len(self.pool.serving())))
        await self._set_health(_NOT_SERVING)
        await self.pool.start()
        self._tasks.append(asyncio.create_task(self._track_health()))

        sock = _listen(self.config.host, self.config.port)
        self.http_port = sock.getsockname()[1]
        uvicorn_config = uvicorn.Config(
            build_app(self.state),
            lifespan="off",
            log_config=None,
            access_log=False,
            # Past --shutdown-timeout the open generations are ended (stop()); this
            # margin lets their last events go out before uvicorn cancels anything.
            timeout_graceful_shutdown=int(self.config.shutdown_timeout) + _END_MARGIN_S,
            timeout_keep_alive=self.config.timeout_keep_alive,
        )
        self._http = _Uvicorn(uvicorn_config)
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))

        # gRPC's port reuse is on by default: a second router on a port in use would
        # start cleanly and split the clients between two deployments.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_RouterServiceServicer_to_server(RouterServicer(self.state), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, _HEALTH_SERVICE, reflection.SERVICE_NAME), server
        )
        host = (
            self.config.host if ":" not in self.config.host else f"[{self.config.host.strip('[]')}]"
        )
        try:
            self.grpc_port = server.add_insecure_port(f"{host}:{self.config.grpc_port}")
        except RuntimeError as exc:
            raise ConfigError(
                f"cannot listen for gRPC on {host}:{self.config.grpc_port} (is the port in "
                f"use? --grpc-port 0 takes any free one): {exc}"
            ) from exc
        await server.start()
        self._grpc = server
        while not self._http.started:
            if self._http_task.done():  # failed to start; surface why
                await self._http_task
            await asyncio.sleep(0.01)
        logger.info(
            "router listening: OpenAI HTTP on %s:%d, gRPC on %s:%d; %s",
            self.config.host,
            self.http_port,
            self.config.host,
            self.grpc_port,
            f"workers from Redis at {self.config.redis_url}"
            if self.config.redis_url
            else f"static workers {', '.join(self.config.worker)} (in-process affinity store)",
        )

    def is_serving(self) -> bool:
        """The model is known and at least one worker of it is SERVING."""
        return self.state.model is not None and bool(self.pool.serving())

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        if self._http is not None:
            self._http.should_exit = True
        ender = asyncio.create_task(self._end_generations_after(self.config.shutdown_timeout))
        if self._grpc is not None:
            await self._grpc.stop(grace=self.config.shutdown_timeout + _END_MARGIN_S)
        if self._http_task is not None:
            await asyncio.gather(self._http_task, return_exceptions=True)
        ender.cancel()
        await asyncio.gather(ender, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pool.close()
        await self.store.close()
        if self.state.model is not None:
            self.state.model.close()

    async def _end_generations_after(self, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        generations = self.dispatcher.generations
        while len(generations) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        open_now = list(generations)
        if not open_now:
            return
        logger.warning(
            "%d requests still open after --shutdown-timeout %g s: ending them",
            len(open_now),
            timeout,
        )
        error = UnavailableError(
            f"the server shut down before the answer was complete (--shutdown-timeout "
            f"{timeout:g} s); retry the request"
        )
        for generation in open_now:
            generation.interrupt(error)

    # ---- the model and health ----------------------------------------------------

    def _on_model_info(self, info: wpb.GetModelInfoResponse) -> None:
        if self.state.model is None and not self._is_loading_model:
            self._is_loading_model = True
            self._tasks.append(asyncio.create_task(self._load_model(info)))

    async def _load_model(self, info: wpb.GetModelInfoResponse) -> None:
        try:
            model = await asyncio.to_thread(ModelContext.load, info, self.config)
        except Exception as exc:
            self.state.model_error = f"the router cannot load the model's tokenizer: {exc}"
            logger.error("%s", self.state.model_error)
            self._is_loading_model = False  # the next announcement tries again
            return
        self.state.model, self.state.model_error = model, None
        logger.info(
            "model %r ready: max_model_len %d, chat template %s",
            model.name,
            model.limits.max_model_len,
            "yes" if model.chat_template else "none",
        )
        self.pool.changed.set()

    async def _track_health(self) -> None:
        while True:
            await self.pool.changed.wait()
            self.pool.changed.clear()
            is_serving = self.state.model is not None and bool(self.pool.serving())
            await self._set_health(_SERVING if is_serving else _NOT_SERVING)

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
