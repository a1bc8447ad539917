"""Which cores and ranks each local rank gets."""

from __future__ import annotations

import torch

from worker.config import ParallelConfig
from worker.executor.placement import local_placements, rendezvous_address, split_cores


def test_cores_split_into_disjoint_equal_groups():
    assert split_cores([0, 1, 2, 3], 2) == [(0, 1), (2, 3)]
    assert split_cores([4, 5, 6, 7, 8], 2) == [(4, 5), (6, 7)]  # equal: 8 stays idle
    assert split_cores([0, 1], 2) == [(0,), (1,)]


def test_a_node_places_its_share_of_the_global_ranks():
    parallel = ParallelConfig(
        tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29600
    )
    address = rendezvous_address(parallel)
    assert address == "tcp://10.0.0.1:29600"
    placements = local_placements(parallel, torch.device("cpu"), address)
    assert [(p.rank, p.local_rank, p.world_size) for p in placements] == [(2, 0, 4), (3, 1, 4)]
    cores = [set(p.cpu_cores) for p in placements]
    assert cores[0] and cores[1] and not cores[0] & cores[1]


def test_the_multi_node_default_port_is_vllms():
    assert rendezvous_address(ParallelConfig(tensor_parallel_size=2, nnodes=2)).endswith(":29501")
