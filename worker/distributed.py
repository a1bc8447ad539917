"""Tensor-parallel process group and its collectives.

Every collective is a no-op at world size 1, so single-device code pays
nothing. Multi-rank runs initialise torch.distributed (NCCL on GPUs, gloo on
CPU) through `init_tensor_parallel` before building the model.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from shared import env
from shared.errors import ConfigError

_TP_RANK = 0
_TP_SIZE = 1
_DEVICE = torch.device("cpu")
# Seconds this process has spent inside collectives, and how many it ran (read by
# bench/tp_step.py; on a GPU only the launches are timed: NCCL runs asynchronously).
collective_seconds = 0.0
collective_calls = 0


def init_tensor_parallel(
    rank: int,
    world_size: int,
    init_method: str | None,
    backend: str,
    device: torch.device | None = None,
) -> None:
    """Join the tensor-parallel group; call once per process before building layers.

    init_method: e.g. tcp://10.0.0.1:29500, where rank 0 listens; a rank that
    cannot meet the others there within PAGODA_RENDEZVOUS_TIMEOUT seconds fails
    with an error naming the address."""
    global _TP_RANK, _TP_SIZE, _DEVICE
    if world_size > 1:
        timeout = env.rendezvous_timeout()
        try:
            dist.init_process_group(
                backend,
                init_method=init_method,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=timeout),
            )
        except (RuntimeError, TimeoutError, ValueError) as exc:
            address = (init_method or "env://").removeprefix("tcp://")
            raise ConfigError(
                f"rank {rank} of {world_size} could not meet the others at {address} within "
                f"{timeout:g}s ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                "check --master-addr / --master-port, that every node started, and firewalls"
            ) from exc
    _TP_RANK, _TP_SIZE = rank, world_size
    _DEVICE = device or torch.device("cpu")


def destroy_tensor_parallel() -> None:
    global _TP_RANK, _TP_SIZE
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP_RANK, _TP_SIZE = 0, 1


def get_tp_rank() -> int:
    return _TP_RANK


def get_tp_size() -> int:
    return _TP_SIZE


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(
            f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})"
        )
    return numerator // denominator


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the tensor-parallel group, in place."""
    global collective_seconds, collective_calls
    if _TP_SIZE > 1:
        start = time.perf_counter()
        dist.all_reduce(x)
        collective_seconds += time.perf_counter() - start
        collective_calls += 1
    return x


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate each rank's `x` along `dim`."""
    global collective_seconds, collective_calls
    if _TP_SIZE == 1:
        return x
    start = time.perf_counter()
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    dist.all_gather(parts, x.contiguous())
    out = torch.cat(parts, dim=dim)
    collective_seconds += time.perf_counter() - start
    collective_calls += 1
    return out


def tp_min(value: int) -> int:
    """The smallest `value` any rank holds (start-up agreement, e.g. KV blocks)."""
    if _TP_SIZE == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
