"""Device, dtype and thread choices, derived once from config and the machine."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from shared import env
from shared.cpu_cores import (
    allowed_cores,
    format_core_list,
    node_of,
    parse_core_list,
    pin_process,
)
from shared.errors import ConfigError
from shared.logging import get_logger
from worker.config import DeviceConfig, ModelConfig
from worker.models.spec import ModelSpec

logger = get_logger(__name__)

_NAMED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(config: DeviceConfig) -> torch.device:
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for, but torch sees no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def configure_cpu_threads(config: DeviceConfig) -> int:
    """Use the cores this process may run on (--cpu-cores pins every thread of the
    process to those first; --cpu-threads of them), say which, and warn when the
    machine is already busy: shared cores make every step slower."""
    if config.cpu_cores is not None:
        wanted = parse_core_list(config.cpu_cores)
        outside = sorted(set(wanted) - set(allowed_cores()))
        if outside:
            raise ConfigError(
                f"--cpu-cores {config.cpu_cores} names cores this process may not use "
                f"({format_core_list(outside)}); allowed: {format_core_list(allowed_cores())}"
            )
        pin_process(wanted)
    cores = sorted(os.sched_getaffinity(0))
    threads = config.cpu_threads or env.cpu_threads() or len(cores)
    node = node_of(cores)
    logger.info(
        "CPU: %d compute threads on cores %s%s",
        threads,
        format_core_list(cores),
        "" if node is None else f" (NUMA node {node})",
    )
    if threads < len(cores):
        # Pin to the first `threads` cores so torch's pool does not migrate.
        os.sched_setaffinity(0, cores[:threads])
    elif threads > len(cores):
        logger.warning(
            "%d compute threads on %d cores take turns, and every step waits for the "
            "slowest: give --cpu-threads %d or more cores",
            threads,
            len(cores),
            len(cores),
        )
    torch.set_num_threads(threads)
    load = os.getloadavg()[0]
    if load > 0.5 * len(cores):
        logger.warning(
            "the 1-minute load average is %.1f on %d cores: other processes share the CPU, "
            "so throughput will be lower and timings noisy",
            load,
            len(cores),
        )
    return threads


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX). Without it,
    torch emulates bf16 matmuls at about half the fp32 rate; with it, at 2-3x.
    PAGODA_CPU_ISA=avx2 answers no: the engine chooses as on an AVX2-only CPU."""
    if env.cpu_isa() == "avx2":
        return False
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # private helpers moved: read the flags ourselves
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
        return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(config: ModelConfig, spec: ModelSpec, device: torch.device) -> torch.dtype:
    """`auto`: a float32 checkpoint runs in float32 on CPU and bfloat16 on GPU. A
    half-precision checkpoint keeps its dtype on GPU; on CPU it runs in bfloat16
    where the CPU has native bf16 arithmetic and in float32 where it does not
    (there fp32 is the faster arithmetic; its linear weights stay stored in the
    checkpoint's half dtype and widen in registers, worker/layers/cpu_half_f32.py)."""
    if config.dtype != "auto":
        if device.type == "cpu" and config.dtype != "float32" and not cpu_has_fast_bf16():
            logger.warning(
                "--dtype %s on a CPU without native bf16 arithmetic (no AVX512-BF16 or AMX): "
                "its matmuls run hundreds of times slower than float32 here; "
                "--dtype auto picks float32",
                config.dtype,
            )
        return _NAMED_DTYPES[config.dtype]
    if device.type == "cpu":
        if spec.checkpoint_dtype == torch.float32 or not cpu_has_fast_bf16():
            return torch.float32
        return torch.bfloat16
    if spec.checkpoint_dtype == torch.float32:
        return torch.bfloat16
    return spec.checkpoint_dtype


def resolve_max_model_len(config: ModelConfig, spec: ModelSpec) -> int:
    limit = spec.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ConfigError(
            f"--max-model-len {config.max_model_len} exceeds the model's "
            f"max_position_embeddings ({limit})"
        )
    return config.max_model_len
