"""Which CPU cores a worker runs on: core lists, NUMA nodes, one disjoint set per worker.

`pagoda serve --num-workers N` on CPU gives each worker cores of its own,
a NUMA node each where there are as many nodes as workers:

```
cores allowed 0-15, 2 NUMA nodes (0-7, 8-15), 2 workers -> 0-7 | 8-15
cores allowed 0-1, 1 node, 2 workers                   -> 0   | 1
cores allowed 0-1, 3 workers                           -> 0   | 1 | 0   (shared: warned)
```

A set is pinned on the whole process (every thread, and the threads it starts
later inherit it), so the torch pool, gRPC and the engine thread all stay
inside it. No torch here: the router imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

_NODES = Path("/sys/devices/system/node")


def parse_core_list(text: str) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11] (Linux's cpulist format)."""
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"not a core list: {text!r} (use e.g. 0-3,8)")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"not a core list: {text!r} ({part} runs backwards)")
        cores.update(range(low, high + 1))
    if not cores:
        raise ValueError(f"not a core list: {text!r} (it names no core)")
    return sorted(cores)


def format_core_list(cores: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8] -> `0-3,8`."""
    parts: list[str] = []
    ordered = sorted(cores)
    start = prev = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


def numa_nodes(allowed: list[int] | None = None) -> dict[int, list[int]]:
    """NUMA node id -> its cores (those in `allowed`, when given), nodes without
    any left out; one node 0 when the machine says nothing of its nodes."""
    nodes: dict[int, list[int]] = {}
    for folder in _NODES.glob("node[0-9]*"):
        try:
            cores = parse_core_list((folder / "cpulist").read_text().strip())
        except (OSError, ValueError):
            continue
        mine = cores if allowed is None else sorted(set(cores) & set(allowed))
        if mine:
            nodes[int(folder.name[4:])] = mine
    if not nodes:
        return {0: sorted(allowed if allowed is not None else allowed_cores())}
    return dict(sorted(nodes.items()))


def node_of(cores: list[int]) -> int | None:
    """The NUMA node holding all of `cores`, if one does."""
    for node, members in numa_nodes().items():
        if set(cores) <= set(members):
            return node
    return None


def split_cores(num_workers: int, allowed: list[int], nodes: list[list[int]]) -> list[list[int]]:
    """One core set per worker, disjoint while there are enough cores.

    With at least as many NUMA nodes as workers, the nodes are shared out whole
    (a worker's memory then stays on its node); otherwise the cores, in order,
    in contiguous runs of equal size (the first ones one core larger).
    """
    if len(nodes) >= num_workers:
        groups: list[list[int]] = [[] for _ in range(num_workers)]
        for index, node in enumerate(nodes):
            groups[index % num_workers].extend(node)
        return [sorted(g) for g in groups]
    ordered = sorted(allowed)
    if num_workers > len(ordered):
        return [[ordered[i % len(ordered)]] for i in range(num_workers)]
    size, extra = divmod(len(ordered), num_workers)
    groups, start = [], 0
    for i in range(num_workers):
        end = start + size + (1 if i < extra else 0)
        groups.append(ordered[start:end])
        start = end
    return groups


def allowed_cores() -> list[int]:
    if not hasattr(os, "sched_getaffinity"):
        return list(range(os.cpu_count() or 1))
    return sorted(os.sched_getaffinity(0))


def pin_process(cores: list[int]) -> None:
    """Every thread of this process onto `cores` (threads started later inherit it)."""
    if not hasattr(os, "sched_setaffinity"):  # not Linux: nothing to pin with
        return
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            continue
