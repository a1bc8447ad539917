"""`pagoda build-kernels`: compile the CPU kernels for this machine now, so that no
worker start has to (the Docker image runs it at build time)."""

from __future__ import annotations

import argparse

from shared.logging import get_logger

logger = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    from kernels.cpu import _build_dir, load_cpu_kernels, load_weight_only_kernels
    from shared import env

    if not env.cpu_kernels():
        logger.error("PAGODA_CPU_KERNELS=0 turns the CPU kernels off: nothing to build")
        return 1
    if load_cpu_kernels() is None or load_weight_only_kernels() is None:
        logger.error("the CPU kernels could not be built here (see the warning above)")
        return 1
    logger.info("CPU kernels ready in %s", _build_dir())
    return 0
