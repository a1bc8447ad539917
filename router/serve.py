"""`pagoda serve MODEL [--num-workers N] [engine flags]`: a whole deployment on one machine.

The router runs in this process; each worker is a `pagoda worker` child on a
free loopback port. With `--redis-url` (or REDIS_URL) workers register there
and the router discovers them like any other; without, the router gets the
workers as a static list and keeps its routing choices in memory, and
workers need no Redis at all.

```
Ctrl-C / SIGTERM  router stops taking requests; open ones finish (--shutdown-timeout)
                  -> workers get SIGTERM and drain -> leftovers SIGKILLed
second signal     workers SIGKILLed at once
```

Children run in their own session (a terminal's Ctrl-C reaches only this
process, which stops them in order) and, on Linux, get SIGTERM if this
process dies without stopping them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
from dataclasses import dataclass, field

from router.cli import event_loop_runner
from router.config import RouterConfig
from router.worker_children import WorkerChildren
from shared.cli_args import add_dataclass_args, dataclass_from_args, dataclass_to_args
from shared.errors import ConfigError
from shared.logging import get_logger
from shared.vllm_flags import add_vllm_habit_flags
from worker.config import EngineConfig
from worker.service.config import WorkerServiceConfig

logger = get_logger(__name__)

# Router flags `serve` takes from the engine's (same name, same meaning) or sets itself.
_ROUTER_SKIP = ("worker", "served_model_name", "tokenizer", "worker_metrics_url")
# Worker-service flags that `serve` sets itself, or that the router flags already name.
_WORKER_SKIP = (
    "host",
    "port",
    "advertise_address",
    "worker_id",
    "redis_url",
    "redis_prefix",
    "parent_pid",
    "metrics_port",
)


@dataclass(frozen=True)
class ServeConfig:
    num_workers: int = field(default=1, metadata={"help": "Worker processes to start."})

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"--num-workers must be >= 1, got {self.num_workers}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    EngineConfig.add_cli_args(parser)
    add_dataclass_args(parser, RouterConfig, skip=_ROUTER_SKIP)
    add_dataclass_args(parser, WorkerServiceConfig, skip=_WORKER_SKIP)
    add_dataclass_args(parser, ServeConfig)
    add_vllm_habit_flags(parser)


def worker_flags(engine: EngineConfig, service: WorkerServiceConfig) -> list[str]:
    """The flags every child gets (port, devices and CPU cores are per child)."""
    flags = ["--model", engine.model.model]
    for group in (engine.model, engine.cache, engine.scheduler, engine.parallel):
        flags += dataclass_to_args(group, skip=("model",))
    flags += dataclass_to_args(engine.device, skip=("cpu_cores",))
    flags += dataclass_to_args(service, skip=_WORKER_SKIP)
    return flags


async def serve(router_config: RouterConfig, children: WorkerChildren) -> int:
    from router.server import RouterServer

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    children.start()
    server = RouterServer(router_config)

    def restarted(worker_id: str) -> None:
        server.metrics.worker_restarts.labels(worker_id).inc()

    watch = asyncio.create_task(
        children.watch(stop, lambda: {h.address for h in server.pool.serving()}, restarted)
    )
    announce = None
    try:
        await server.start()
        announce = asyncio.create_task(_announce_when_serving(server, len(children.processes)))
        await stop.wait()
        logger.info("shutting down: the router first, then the workers")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal: no more waiting
            loop.add_signal_handler(sig, children.kill)
        watch.cancel()
        if announce is not None:
            announce.cancel()
        await server.stop()
        await asyncio.to_thread(children.stop)
    return 0 if not children.failed else 1


async def _announce_when_serving(server, num_workers: int) -> None:
    """ "serving at" once a request can be served, not while the workers still load."""
    while not server.is_serving():
        await asyncio.sleep(0.2)
    logger.info(
        "serving at http://%s:%d/v1 (%d of %d workers ready; Ctrl-C stops everything)",
        server.config.host,
        server.http_port,
        len(server.pool.serving()),
        num_workers,
    )


def run(args: argparse.Namespace) -> int:
    try:
        engine = EngineConfig.from_cli_args(args)
        serve_config = dataclass_from_args(ServeConfig, args)
        service = dataclass_from_args(WorkerServiceConfig, args, host="127.0.0.1", port=0)
        router_config = dataclass_from_args(RouterConfig, args)
        children = WorkerChildren(
            serve_config.num_workers,
            worker_flags(engine, service),
            router_config.redis_url,
            router_config.redis_prefix,
            engine.parallel.tensor_parallel_size,
            engine.device.device,
            engine.device.cpu_cores,
        )
        router_config = dataclasses.replace(
            router_config,
            # With Redis the router finds the workers in the registry.
            worker=() if router_config.redis_url else tuple(children.addresses),
            worker_metrics_url=tuple(children.metrics_targets),
            served_model_name=engine.model.name,
            tokenizer=engine.model.tokenizer or engine.model.model,
        )
        return event_loop_runner()(serve(router_config, children))
    except (ConfigError, OSError) as exc:
        logger.error("%s", exc)
        return 2
