"""Which hardware each rank of this node gets, decided once in the engine process."""

from __future__ import annotations

import os

import torch

from shared.cpu_cores import parse_core_list
from shared.errors import ConfigError
from shared.ports import PortReservation
from worker.config import DEFAULT_MASTER_PORT, DeviceConfig, ParallelConfig
from worker.executor.rank_worker import RankPlacement


def device_type(config: DeviceConfig) -> torch.device:
    """The kind of device the ranks will use, without creating a CUDA context in
    this process (the engine process of a TP group holds no model: a context
    here would take memory from rank 0's GPU)."""
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for, but torch sees no CUDA device")
        return torch.device("cuda")
    return torch.device("cpu")


def rendezvous_address(parallel: ParallelConfig) -> str:
    """Where the group meets: --master-addr and --master-port, or vLLM's default
    port across nodes (each node must name the same one)."""
    port = parallel.master_port if parallel.master_port is not None else DEFAULT_MASTER_PORT
    return f"tcp://{parallel.master_addr}:{port}"


def reserve_rendezvous(parallel: ParallelConfig) -> tuple[str, PortReservation | None]:
    """The rendezvous of a group, and on one node without --master-port a free port
    for it, held until the caller closes the reservation: rank 0 binds it seconds
    later, once its process has started (shared/ports.py)."""
    if parallel.master_port is not None or parallel.nnodes > 1:
        return rendezvous_address(parallel), None
    reservation = PortReservation(parallel.master_addr)
    return f"tcp://{parallel.master_addr}:{reservation.port}", reservation


def split_cores(cores: list[int], num_ranks: int) -> list[tuple[int, ...]]:
    """Disjoint, equal, contiguous groups; a remainder core is left idle.

    NOTE: equal on purpose. Every rank samples from the same gathered logits and
    must draw the same token; torch's CPU reductions can round differently at
    different thread counts, and ranks whose tokens differ would go on silently
    wrong."""
    per = len(cores) // num_ranks
    return [tuple(cores[i * per : (i + 1) * per]) for i in range(num_ranks)]


def local_placements(
    parallel: ParallelConfig,
    device: torch.device,
    init_method: str,
    cpu_cores: str | None = None,
) -> list[RankPlacement]:
    """This node's ranks: one GPU each, or on CPU each its own share of the cores
    this process may run on (of --cpu-cores, when given)."""
    num_local, tp = parallel.ranks_per_node, parallel.tensor_parallel_size
    if device.type == "cuda":
        num_gpus = torch.cuda.device_count()
        if num_gpus < num_local:
            raise ConfigError(
                f"--tensor-parallel-size {tp} needs {num_local} GPUs on this node, but "
                f"{num_gpus} are visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); lower it to {num_gpus} "
                "or less"
            )
        core_groups: list[tuple[int, ...] | None] = [None] * num_local
    else:
        cores = sorted(parse_core_list(cpu_cores) if cpu_cores else os.sched_getaffinity(0))
        if len(cores) < num_local:
            raise ConfigError(
                f"--tensor-parallel-size {tp} needs {num_local} CPU cores on this node, one per "
                f"rank at least, but this worker may use {len(cores)} ({cores}); lower it to "
                f"{len(cores)} or less, or give the worker more cores"
            )
        core_groups = split_cores(cores, num_local)
    first = parallel.node_rank * num_local
    return [
        RankPlacement(
            rank=first + i,
            world_size=tp,
            local_rank=i,
            num_local_ranks=num_local,
            cpu_cores=core_groups[i],
            init_method=init_method,
        )
        for i in range(num_local)
    ]
