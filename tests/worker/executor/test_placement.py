"""Which cores and ranks each local rank gets."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch
from torch.distributed import TCPStore

from worker.config import ParallelConfig
from worker.executor.placement import (
    local_placements,
    rendezvous_address,
    reserve_rendezvous,
    split_cores,
)


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


def test_one_node_holds_its_rendezvous_port_until_rank_0_listens():
    address, held = reserve_rendezvous(ParallelConfig(tensor_parallel_size=2))
    port = int(address.rsplit(":", 1)[1])
    assert address == f"tcp://127.0.0.1:{port}" and held.port == port
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", port))  # nobody else gets it meanwhile
    store = TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=10))  # rank 0 does
    store.set("k", "v")
    held.close()
    del store


def test_a_given_or_multi_node_port_is_not_reserved():
    address, held = reserve_rendezvous(ParallelConfig(tensor_parallel_size=2, master_port=29650))
    assert address == "tcp://127.0.0.1:29650" and held is None
    assert reserve_rendezvous(ParallelConfig(tensor_parallel_size=2, nnodes=2))[1] is None
