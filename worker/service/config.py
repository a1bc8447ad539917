"""The worker service's own flags, beside the engine's (worker/config.py)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from shared import env
from shared.errors import ConfigError
from shared.registry import DEFAULT_PREFIX

# Hosts that mean "every interface": not an address another machine can dial.
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class WorkerServiceConfig:
    host: str = field(default="0.0.0.0", metadata={"help": "Interface to listen on."})
    port: int = field(default=50051, metadata={"help": "gRPC port (0: any free port)."})
    advertise_address: str | None = field(
        default=None,
        metadata={"help": "host:port routers dial, as registered in Redis (default: derived)."},
    )
    worker_id: str | None = field(
        default=None, metadata={"help": "Id in the Redis registry (default: HOSTNAME-PORT)."}
    )
    redis_url: str | None = field(
        default_factory=env.redis_url,
        metadata={"help": "Redis to register in, e.g. redis://host:6379/0 (default: $REDIS_URL)."},
    )
    redis_prefix: str = field(
        default=DEFAULT_PREFIX, metadata={"help": "Prefix of every Redis key this worker writes."}
    )
    heartbeat_ttl: float = field(
        default=5.0,
        metadata={"help": "Seconds the registry keeps this worker without a heartbeat."},
    )
    max_waiting: int = field(
        default=1024,
        metadata={"help": "Waiting requests beyond which Generate is RESOURCE_EXHAUSTED."},
    )
    drain_timeout: float = field(
        default=30.0,
        metadata={"help": "Seconds in-flight requests get to finish after SIGTERM."},
    )
    metrics_port: int | None = field(
        default=None,
        metadata={
            "help": "HTTP port serving GET /metrics (Prometheus, vLLM's metric names; "
            "0: any free port; default: none)."
        },
    )
    stream_interval: int = field(
        default=1,
        metadata={
            "help": "Tokens per streamed response: each stream's tokens are held until "
            "this many are waiting (its first and last go out at once); fewer responses "
            "cost the worker, router and client less CPU. A request's stream_interval "
            "can raise it."
        },
    )
    parent_pid: int | None = field(
        default=None,
        metadata={
            "help": "Stop (as on SIGTERM) when the process with this id is gone; "
            "pagoda serve sets it for its workers."
        },
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be in [0, 65535], got {self.metrics_port}")
        if self.heartbeat_ttl <= 0:
            raise ConfigError(f"--heartbeat-ttl must be > 0, got {self.heartbeat_ttl}")
        if self.max_waiting < 1:
            raise ConfigError(f"--max-waiting must be >= 1, got {self.max_waiting}")
        if self.stream_interval < 1:
            raise ConfigError(f"--stream-interval must be >= 1, got {self.stream_interval}")
        if self.drain_timeout < 0:
            raise ConfigError(f"--drain-timeout must be >= 0, got {self.drain_timeout}")
        if not self.redis_prefix:
            raise ConfigError("--redis-prefix must not be empty")

    @property
    def bind_address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class WorkerIdentity:
    """Who this worker is, once its port is bound: derived, never written back."""

    worker_id: str
    address: str
    epoch: int


def resolve_identity(config: WorkerServiceConfig, bound_port: int, epoch: int) -> WorkerIdentity:
    host = config.host
    if host in _WILDCARD_HOSTS:
        host = socket.gethostname()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    address = config.advertise_address or f"{host}:{bound_port}"
    worker_id = config.worker_id or f"{socket.gethostname()}-{bound_port}"
    return WorkerIdentity(worker_id, address, epoch)
