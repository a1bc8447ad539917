"""`pagoda worker --model M --port P [engine flags]`: serve one model over gRPC."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from shared.cli_args import add_dataclass_args, dataclass_from_args
from shared.errors import ConfigError, UnavailableError
from shared.logging import get_logger
from shared.vllm_flags import add_vllm_habit_flags
from worker.config import EngineConfig
from worker.service.config import WorkerServiceConfig
from worker.service.parent_watch import watch_parent
from worker.service.primitive_caches import bound_primitive_caches

logger = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    EngineConfig.add_cli_args(parser, positional_model=False)
    add_dataclass_args(parser, WorkerServiceConfig)
    add_vllm_habit_flags(parser)


class StoppedWhileLoading(Exception):
    """A signal came before the engine was up: nothing to drain, nothing to wait for."""


async def serve(engine_config: EngineConfig, config: WorkerServiceConfig) -> int:
    """Serve until SIGTERM or SIGINT, then drain; a second signal stops waiting.
    A signal while the model still loads (or its kernels compile) stops at once."""
    from worker.service.server import WorkerServer

    server = WorkerServer(engine_config, config)
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            logger.warning("second signal: not waiting for in-flight requests")
            server.hub.fail_all(UnavailableError("the worker was stopped"))
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    starting = asyncio.ensure_future(server.start())
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        # NOTE: the engine thread may sit in C++ (weights, a kernel build) for minutes
        # and cannot be interrupted; the process ends around it (run() exits hard).
        starting.cancel()
        raise StoppedWhileLoading
    try:
        starting.result()
    except BaseException:
        signalled.cancel()
        await server.stop()
        raise
    failed = asyncio.ensure_future(server.failed.wait())
    await asyncio.wait([signalled, failed], return_when=asyncio.FIRST_COMPLETED)
    if server.failed.is_set():
        signalled.cancel()
        logger.error("the engine cannot run any more: stopping the worker")
        await server.drain_and_stop(timeout=5.0)  # its streams have already ended
        return 1
    failed.cancel()
    logger.info("shutting down")
    await server.drain_and_stop()
    return 0


def _stop_children() -> None:
    """SIGTERM this process's own children (a kernel build's compiler), which would
    otherwise run on, orphaned, beside the next start's build."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:  # the parent's pid, after the state field
            with contextlib.suppress(OSError):
                os.kill(int(stat.parent.name), signal.SIGTERM)


def run(args: argparse.Namespace) -> int:
    try:
        engine_config = EngineConfig.from_cli_args(args)
        config = dataclass_from_args(WorkerServiceConfig, args)
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    if config.parent_pid is not None:
        watch_parent(config.parent_pid)
    # Before any oneDNN call, and before rank processes start (they inherit it).
    logger.debug("oneDNN cache capacities: %s", bound_primitive_caches())
    if engine_config.parallel.node_rank > 0:  # a multi-node group's other machines
        from worker.executor.remote_node import run_node

        try:
            return run_node(engine_config)
        except ConfigError as exc:
            logger.error("%s", exc)
            return 2
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # Windows: the default event loop
        runner = asyncio.run
    try:
        return runner(serve(engine_config, config))
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    except StoppedWhileLoading:
        logger.info("stopped while loading the model: exiting without waiting for it")
        _stop_children()
        logging.shutdown()
        os._exit(0)
