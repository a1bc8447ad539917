"""`pagoda build-kernels`: compile the CPU kernels for this machine now, so that no
worker start has to (the Docker image runs it at build time)."""

from __future__ import annotations

import argparse

from shared.logging import get_logger

logger = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    from kernels import cpu
    from shared import env

    if not env.cpu_kernels():
        logger.error("PAGODA_CPU_KERNELS=0 turns the CPU kernels off: nothing to build")
        return 1
    # Every module a worker may load: one left out would compile at the first
    # start that needs it (an fp8 KV cache, half-storage linears).
    loaders = (
        cpu.load_cpu_kernels,
        cpu.load_weight_only_kernels,
        cpu.load_fp8_kv_kernels,
        cpu.load_half_f32_kernels,
        cpu.load_gemv_kernels,
        cpu.load_gemv_f32_kernels,
    )
    missing = []
    for load in loaders:
        module = load()
        if module is None:
            missing.append(load.__name__)
        else:
            logger.info("%s: %s", module.__name__, module.__file__)
    if missing:
        logger.error(
            "the CPU kernels could not be built here (%s; see the warnings above)",
            ", ".join(missing),
        )
        return 1
    logger.info("CPU kernels ready in %s", cpu._build_dir())
    return 0
