"""The worker's lifecycle: listen, load, warm up, serve, drain, leave.

```
start()           gRPC up (health NOT_SERVING) -> load the engine (a thread) -> engine
                  thread -> warm-up step -> Redis publisher -> health SERVING
drain_and_stop()  health NOT_SERVING, refuse new requests -> wait for in-flight ones
                  (--drain-timeout, then fail them UNAVAILABLE) -> stop gRPC ->
                  stop the engine thread -> leave Redis
```
"""

from __future__ import annotations

import asyncio
import functools

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from shared.errors import ConfigError, UnavailableError
from shared.logging import get_logger
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from shared.registry import RegistryKeys, now_ms
from shared.sampling_params import SamplingParams
from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.service.config import WorkerIdentity, WorkerServiceConfig, resolve_identity
from worker.service.convert import model_info, worker_info
from worker.service.engine_loop import Batch, EngineLoop
from worker.service.load import LoadTracker
from worker.service.metrics import WorkerMetrics
from worker.service.registry_publisher import RegistryPublisher
from worker.service.request_hub import RequestHub
from worker.service.servicer import WorkerServicer
from worker.stats import SchedulerStats

logger = get_logger(__name__)

WORKER_SERVICE = pb.DESCRIPTOR.services_by_name["WorkerService"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# "" is the whole server, as health checkers ask by default.
_HEALTH_NAMES = ("", WORKER_SERVICE)
_MAX_MESSAGE_BYTES = 64 * 2**20  # prompt logprobs of a long prompt are large
_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    # Two workers must never share a port silently.
    ("grpc.so_reuseport", 0),
    # Routers ping every 10 s to find dead peers (router/routing/worker_handle.py);
    # without these the server would answer their pings with GOAWAY.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def warm_up(engine: LLMEngine) -> SchedulerStats:
    """Run one tiny request to completion, then forget its cached blocks, so the
    first real request meets a warm engine and a clean prefix cache."""
    token = engine.spec.bos_token_id
    if token is None or not 0 <= token < engine.vocab_size:
        token = 0
    engine.add_request("warm-up", [token], SamplingParams(temperature=0, max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    pool = engine.core.scheduler.kv.pool
    pool.reset_prefix_cache()
    pool.take_events()
    return engine.core.scheduler.make_stats()


class WorkerServer:
    def __init__(self, engine_config: EngineConfig, config: WorkerServiceConfig) -> None:
        self.engine_config = engine_config
        self.config = config
        self.load = LoadTracker()
        self.hub = RequestHub(self.load)
        self.health = health.aio.HealthServicer()
        self.engine: LLMEngine | None = None
        self.engine_loop: EngineLoop | None = None
        self.publisher: RegistryPublisher | None = None
        self.identity: WorkerIdentity | None = None
        self.port = 0
        self._model_info: pb.GetModelInfoResponse | None = None
        self._grpc: grpc.aio.Server | None = None
        self._is_marked_broken = False
        self._health_task: asyncio.Future | None = None
        self.metrics_registry = CollectorRegistry()
        self.metrics_port = 0
        self._metrics_http = None
        # Set when the engine can never step again (a tensor-parallel rank died).
        self.failed = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self._set_health(_NOT_SERVING)
        server = grpc.aio.server(options=_GRPC_OPTIONS)
        servicer = WorkerServicer(self.hub, lambda: self._model_info, self.load.snapshot)
        pb_grpc.add_WorkerServiceServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (WORKER_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server
        )
        try:
            self.port = server.add_insecure_port(self.config.bind_address)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {self.config.bind_address}: {exc}") from exc
        await server.start()
        self._grpc = server
        if self.config.metrics_port is not None:  # bound now: a taken port fails before loading
            try:
                self._metrics_http, _ = start_http_server(
                    self.config.metrics_port, self.config.host, self.metrics_registry
                )
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {self.config.host}:{self.config.metrics_port}: {exc}"
                ) from exc
            self.metrics_port = self._metrics_http.server_port
            logger.info("metrics at http://%s:%d/metrics", self.config.host, self.metrics_port)
        logger.info(
            "listening on %s; loading %s", self.config.bind_address, self.engine_config.model.model
        )

        use_redis = self.config.redis_url is not None
        record = use_redis and self.engine_config.cache.enable_prefix_caching
        self.engine_loop = EngineLoop(
            functools.partial(LLMEngine, self.engine_config, record_kv_events=record),
            loop,
            self._deliver,
            self.load,
            self.config.max_waiting,
            stream_interval=self.config.stream_interval,
        )
        self.engine_loop.start()  # builds the engine on its own thread (engine_loop.py)
        engine = await asyncio.wrap_future(self.engine_loop.ready)
        self.engine = engine
        self.identity = resolve_identity(self.config, self.port, epoch=now_ms())
        info = worker_info(engine, self.identity, started_at_ms=self.identity.epoch)
        if use_redis:
            self.publisher = RegistryPublisher(
                self.config.redis_url,
                RegistryKeys(self.config.redis_prefix),
                info,
                self.load.snapshot,
                self.config.heartbeat_ttl,
            )
        # Before any request can reach the engine (the hub is not attached yet).
        self.engine_loop.on_kv_events = self.publisher.submit if self.publisher else None
        metrics = WorkerMetrics(
            self.metrics_registry, self.engine_config.model.name, engine.core.max_model_len
        )
        self.engine_loop.metrics = metrics
        self.hub.attach(engine, self.engine_loop)
        stats = await asyncio.wrap_future(self.engine_loop.call(warm_up))
        self.load.record_step(stats, 0, 0)
        metrics.start_counting(stats)
        self._model_info = model_info(engine, info, self.config.max_waiting)
        if self.publisher:
            self.publisher.start()
        self.hub.is_ready = True
        await self._set_health(_SERVING)
        logger.info(
            "serving %s as %s at %s (epoch %d%s)",
            info.model,
            info.worker_id,
            info.address,
            info.epoch,
            f", registered in Redis under {self.config.redis_prefix!r}" if use_redis else "",
        )

    def _deliver(self, batch: Batch) -> None:
        self.hub.deliver(batch)
        if (
            self.engine_loop is not None
            and self.engine_loop.is_broken
            and not self._is_marked_broken
        ):
            self._is_marked_broken = True
            self._health_task = asyncio.ensure_future(self._set_health(_NOT_SERVING))
            if self.engine_loop.fatal_error is not None:
                self.failed.set()

    async def _set_health(self, status: int) -> None:
        for name in _HEALTH_NAMES:
            await self.health.set(name, status)

    async def drain_and_stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown; safe to call whatever start() reached."""
        timeout = self.config.drain_timeout if timeout is None else timeout
        self.hub.is_draining = self.load.is_draining = True
        await self.health.enter_graceful_shutdown()
        if self.publisher:
            self.publisher.beat_now()
        if self.hub.num_streams:
            logger.info("draining %d in-flight requests (up to %gs)", self.hub.num_streams, timeout)
        if not await self.hub.wait_idle(timeout):
            logger.warning("drain timeout: failing %d requests", self.hub.num_streams)
            self.hub.fail_all(UnavailableError("the worker shut down before the request finished"))
            await self.hub.wait_idle(5.0)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once (in-flight calls are cancelled); safe to call twice."""
        server, self._grpc = self._grpc, None
        if server is not None:
            await server.stop(grace=1.0)
        engine_loop, self.engine_loop = self.engine_loop, None
        if engine_loop is not None:
            await asyncio.to_thread(engine_loop.stop, 10.0)
        publisher, self.publisher = self.publisher, None
        if publisher is not None:
            await asyncio.to_thread(publisher.stop, True)
        metrics_http, self._metrics_http = self._metrics_http, None
        if metrics_http is not None:
            await asyncio.to_thread(metrics_http.shutdown)
            metrics_http.server_close()
