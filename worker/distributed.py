"""Tensor-parallel process group and its collectives.

Every collective is a no-op at world size 1, so single-device code pays
nothing. Multi-rank runs initialise torch.distributed (NCCL on GPUs, gloo on
CPU) through `init_tensor_parallel` before building the model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_SIZE = 1


def init_tensor_parallel(rank: int, world_size: int, init_method: str, backend: str) -> None:
    """Join the tensor-parallel group; call once per process before building layers."""
    global _TP_RANK, _TP_SIZE
    if world_size > 1:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    _TP_RANK, _TP_SIZE = rank, world_size


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
    if _TP_SIZE > 1:
        dist.all_reduce(x)
    return x


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate each rank's `x` along `dim`."""
    if _TP_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
