"""Core lists and the split of cores between workers."""

from __future__ import annotations

import pytest

from shared.cpu_cores import format_core_list, parse_core_list, split_cores


def test_core_lists_parse_and_format_as_linux_writes_them():
    assert parse_core_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_core_list(" 5 ") == [5]
    assert format_core_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_core_list([4]) == "4"
    for bad in ("", "a", "3-1", "1-", "-2"):
        with pytest.raises(ValueError, match="not a core list"):
            parse_core_list(bad)


def test_workers_get_disjoint_runs_of_cores():
    assert split_cores(2, [0, 1], [[0, 1]]) == [[0], [1]]
    assert split_cores(3, list(range(8)), [list(range(8))]) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert split_cores(1, [2, 3], [[2, 3]]) == [[2, 3]]


def test_with_a_numa_node_per_worker_each_gets_whole_nodes():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_cores(2, list(range(8)), nodes) == nodes
    four = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert split_cores(2, list(range(8)), four) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_more_workers_than_cores_share_them_round_robin():
    assert split_cores(3, [0, 1], [[0, 1]]) == [[0], [1], [0]]
