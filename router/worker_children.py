"""`pagoda worker` child processes of `pagoda serve`: start, watch, stop in order.

On CPU each child gets cores of its own (shared/cpu_cores.py), pinned before
it execs and passed on as --cpu-cores, so its log says which. A child gets
SIGTERM when this process dies (PR_SET_PDEATHSIG, set before exec) and also
watches for it itself (--parent-pid): the signal is tied to the thread that
started the child, and a `kill -9` of this process must leave no worker
behind either way.

A worker that dies after it started well (the router saw it serving, or it
lived RESTART_AFTER_S) is started again on its port and cores, after a backoff
that doubles up to MAX_BACKOFF_S while it keeps dying; the router's health
watch takes it back once it serves. Each worker's ports stay reserved here
(shared/ports.py) from before its first start until the workers are stopped,
so no other socket on the machine takes them while a worker loads or restarts.
One that dies sooner failed to start (bad flags, no memory) and stays down; when
none is left, serve stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from shared.cpu_cores import allowed_cores, format_core_list, node_of, numa_nodes, split_cores
from shared.logging import get_logger
from shared.ports import PortReservation

logger = get_logger(__name__)

_PR_SET_PDEATHSIG = 1
# How long stopped workers get to drain before they are killed.
STOP_TIMEOUT_S = 60.0
RESTART_AFTER_S = 5.0
MAX_BACKOFF_S = 30.0


def _before_exec(cores: list[int] | None) -> None:
    """In the child, before exec: SIGTERM when the parent dies, and its cores (Linux)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if cores is not None:
        os.sched_setaffinity(0, cores)


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


class WorkerChildren:
    def __init__(
        self,
        num_workers: int,
        flags: list[str],
        redis_url: str | None,
        redis_prefix: str,
        tensor_parallel_size: int = 1,
        device: str = "auto",
        cpu_cores: str | None = None,
    ) -> None:
        self._flags = flags
        if redis_url:
            self._flags = [*flags, "--redis-url", redis_url, "--redis-prefix", redis_prefix]
        # Held until kill(): a port that is free now may not be in the seconds
        # before a worker binds it (a worker that fails to bind is not restarted).
        self._reservations = [PortReservation() for _ in range(2 * num_workers)]
        self.ports = [r.port for r in self._reservations[:num_workers]]
        self.addresses = [f"127.0.0.1:{port}" for port in self.ports]
        self.metrics_ports = [r.port for r in self._reservations[num_workers:]]
        # Each worker's own id (its default: HOSTNAME-PORT), as the router's other
        # per-worker series and the x-pagoda-worker header name it.
        self.worker_ids = [f"{socket.gethostname()}-{port}" for port in self.ports]
        self.metrics_targets = [
            f"{worker_id}=http://127.0.0.1:{metrics_port}/metrics"
            for worker_id, metrics_port in zip(self.worker_ids, self.metrics_ports)
        ]
        self._devices = self._assign_devices(num_workers, tensor_parallel_size, device)
        self.cores = self._assign_cores(
            num_workers, device, cpu_cores, self._devices, tensor_parallel_size
        )
        self.processes: list[subprocess.Popen] = []
        self._reported: set[int] = set()
        self.failed = False
        self.num_restarts = 0
        self._started_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._restart_at: dict[int, float] = {}
        self._served: set[int] = set()  # seen serving since they last started

    @staticmethod
    def _assign_devices(num_workers: int, tp: int, device: str) -> list[str | None]:
        """One GPU set per worker when there are enough; else they share what is visible."""
        gpus = [] if device == "cpu" else visible_gpus()
        if len(gpus) >= num_workers * tp:
            return [",".join(gpus[i * tp : (i + 1) * tp]) for i in range(num_workers)]
        if gpus and num_workers > 1:
            logger.warning(
                "%d workers x %d GPUs each wanted, %d visible: the workers share them",
                num_workers,
                tp,
                len(gpus),
            )
        return [None] * num_workers

    @staticmethod
    def _assign_cores(
        num_workers: int,
        device: str,
        cpu_cores: str | None,
        gpus: list[str | None],
        tp: int = 1,
    ) -> list[list[int] | None]:
        """Disjoint CPU cores per worker (a NUMA node each where there are enough),
        when the workers compute on the CPU; a tensor-parallel worker needs a core
        per rank, so too few cores for that are shared between workers instead."""
        if device == "cuda" or (device == "auto" and (any(gpus) or visible_gpus())):
            return [None] * num_workers
        from shared.cpu_cores import parse_core_list

        allowed = parse_core_list(cpu_cores) if cpu_cores else allowed_cores()
        nodes = [c for c in numa_nodes(allowed).values()]
        groups = split_cores(num_workers, allowed, nodes)
        if tp > 1 and len(allowed) >= tp and min(len(g) for g in groups) < tp:
            logger.warning(
                "%d workers x %d ranks on %d cores: the workers share cores, and each is "
                "slower for it",
                num_workers,
                tp,
                len(allowed),
            )
            ordered = sorted(allowed)
            return [
                sorted(ordered[(i * tp + j) % len(ordered)] for j in range(tp))
                for i in range(num_workers)
            ]
        if num_workers > len(allowed):
            logger.warning(
                "%d workers on %d cores: some share a core, and each is slower for it",
                num_workers,
                len(allowed),
            )
        return groups

    def start(self) -> None:
        for i in range(len(self.ports)):
            self._spawn(i)

    def _spawn(self, i: int) -> None:
        env = dict(os.environ)
        if self._devices[i] is not None:
            env["CUDA_VISIBLE_DEVICES"] = self._devices[i]
        command = [sys.executable, "-m", "shared.cli", "worker", *self._flags]
        command += [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.ports[i]),
            "--parent-pid",
            str(os.getpid()),
            "--metrics-port",
            str(self.metrics_ports[i]),
        ]
        cores = self.cores[i]
        where = ""
        if cores is not None:
            command += ["--cpu-cores", format_core_list(cores)]
            node = node_of(cores)
            where = f", cores {format_core_list(cores)}" + (
                "" if node is None else f" (NUMA node {node})"
            )
        process = subprocess.Popen(
            command,
            env=env,
            start_new_session=True,
            preexec_fn=functools.partial(_before_exec, cores),
        )
        if i < len(self.processes):
            self.processes[i] = process
        else:
            self.processes.append(process)
        self._started_at[i] = time.monotonic()
        logger.info("started worker %d (pid %d) on port %d%s", i, process.pid, self.ports[i], where)

    async def watch(
        self,
        stop: asyncio.Event,
        serving: Callable[[], set[str]] = frozenset,
        on_restart: Callable[[str], None] = lambda worker_id: None,
    ) -> None:
        """Restart workers that die after starting well; stop everything when none is
        left (every one failed to start). serving(): the addresses the router sees
        serving now; a worker seen there started well however soon it dies.
        on_restart(worker id): a worker is started again (the router's metric)."""
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            seen = serving()
            for i, process in enumerate(self.processes):
                code = process.poll()
                if code is None and self.addresses[i] in seen:
                    self._served.add(i)
                if code is not None and i not in self._reported:
                    self._reported.add(i)
                    self.failed = True
                    lived = now - self._started_at[i]
                    logger.error(
                        "worker %d (pid %d) exited with code %d after %.0f s",
                        i, process.pid, code, lived,
                    )  # fmt: skip
                    if i in self._served or lived >= RESTART_AFTER_S:
                        delay = self._backoff.get(i, 1.0) if lived < 60 else 1.0
                        self._backoff[i] = min(2 * delay, MAX_BACKOFF_S)
                        self._restart_at[i] = now + delay
                        logger.warning("restarting worker %d in %.0f s", i, delay)
            for i, at in list(self._restart_at.items()):
                if now >= at:
                    del self._restart_at[i]
                    self._reported.discard(i)
                    self._served.discard(i)
                    self.num_restarts += 1
                    self._spawn(i)
                    on_restart(self.worker_ids[i])
            if len(self._reported) == len(self.processes) and not self._restart_at:
                logger.error("no worker left: stopping")
                stop.set()
                return

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (workers drain, then exit), then SIGKILL whatever is left."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                logger.warning("worker pid %d did not stop in time: killing it", process.pid)
        self.kill()

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for reservation in self._reservations:
            reservation.close()
