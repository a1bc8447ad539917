"""A redis-server process of a test's own, on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
import time

import redis

from shared.ports import free_port_run


def answers(url: str) -> bool:
    try:
        return bool(
            redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
        )
    except (redis.RedisError, OSError):
        return False


class RedisServer:
    """`start()`/`stop()` may be repeated: the port stays, the data does not (no persistence)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port_run()
        self.process: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not answers(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None
