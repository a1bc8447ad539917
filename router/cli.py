"""`pagoda router [--worker host:port ...] [--redis-url URL]`: the router on its own."""

from __future__ import annotations

import argparse
import asyncio
import signal

from router.config import RouterConfig
from shared.cli_args import add_dataclass_args, dataclass_from_args
from shared.errors import ConfigError
from shared.logging import get_logger
from shared.vllm_flags import add_vllm_habit_flags

logger = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, RouterConfig)
    add_vllm_habit_flags(parser)


async def wait_for_signal() -> None:
    """Return at the first SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(config: RouterConfig) -> int:
    from router.server import RouterServer

    server = RouterServer(config)
    try:
        await server.start()
        await wait_for_signal()
        logger.info("shutting down")
    finally:
        await server.stop()
    return 0


def event_loop_runner():
    try:
        import uvloop

        return uvloop.run
    except ImportError:  # Windows: the default event loop
        return asyncio.run


def run(args: argparse.Namespace) -> int:
    try:
        config = dataclass_from_args(RouterConfig, args)
        config.check_has_workers()
        return event_loop_runner()(serve(config))
    except (ConfigError, OSError) as exc:
        logger.error("%s", exc)
        return 2
