"""Real Pagoda processes for end-to-end tests: `pagoda serve`, routers, workers.

Every process is `python -m shared.cli SUBCOMMAND ...` with PYTHONPATH set,
logs to a file of its own (read back when a test fails), and is always
stopped by whoever started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared.ports import free_port_run
from tests.conftest import wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
# Generous: a cold machine compiles the CPU attention kernel on first use (~40 s).
START_TIMEOUT = 180.0
# Tiny blocks and a small context, so tests count blocks; one CPU thread per worker,
# so two workers and the test process share two cores without thrashing.
ENGINE_FLAGS = (
    "--block-size=4",
    "--max-model-len=256",
    "--num-kv-blocks=512",
    "--cpu-threads=1",
    "--max-num-batched-tokens=512",
)


class PagodaProcess:
    """`pagoda SUBCOMMAND ARGS` as a child process."""

    def __init__(self, subcommand: str, args: list[str], log_path: Path, env: dict | None = None):
        environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        environment.pop("REDIS_URL", None)  # only what a test passes explicitly
        environment.update(env or {})
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", subcommand, *args],
            cwd=REPO_ROOT,
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def check_alive(self) -> None:
        assert self.is_alive(), f"exited with {self.process.returncode}:\n{self.log()[-6000:]}"

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        if self.is_alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._log.close()
        return self.process.returncode


def health(base_url: str) -> dict:
    try:
        response = httpx.get(f"{base_url}/health", timeout=2)
    except httpx.HTTPError:
        return {}
    return response.json() if response.status_code == 200 else {}


def wait_serving(process: PagodaProcess, base_url: str, num_workers: int) -> None:
    """Until the router at base_url sees `num_workers` workers SERVING."""

    def ready() -> bool:
        process.check_alive()
        return health(base_url).get("workers_serving", 0) >= num_workers

    wait_for(ready, timeout=START_TIMEOUT, interval=0.2, what=f"{num_workers} workers serving")


@dataclass
class RouterProcess:
    process: PagodaProcess
    port: int
    grpc_port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_router(
    subcommand: str, args: list[str], log_path: Path, env: dict | None = None
) -> RouterProcess:
    """`pagoda serve` or `pagoda router` on free ports (not waited for)."""
    port, grpc_port = free_port_run(), free_port_run()
    flags = ["--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port)]
    return RouterProcess(PagodaProcess(subcommand, [*args, *flags], log_path, env), port, grpc_port)


def start_worker(model: Path, args: list[str], log_path: Path) -> PagodaProcess:
    port = free_port_run()
    flags = ["--model", str(model), "--host", "127.0.0.1", f"--port={port}", *ENGINE_FLAGS]
    return PagodaProcess("worker", [*flags, *args], log_path)


def stop_all(processes: list[PagodaProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for process in processes:
        process.stop(max(deadline - time.monotonic(), 1))


def http_up(router) -> bool:
    """The router (still alive) answers HTTP."""
    router.process.check_alive()
    try:
        httpx.get(f"{router.base_url}/version", timeout=1)
    except httpx.HTTPError:
        return False
    return True
