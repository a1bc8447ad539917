"""The router's Prometheus metrics, in a registry of its own (served at GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from router.routing.policy import REASONS
from router.routing.worker_stream import FAILOVER_REASONS

_PREFIX = "pagoda_router"
# Seconds; fine at the low end, where a warm prefix cache puts the first token.
_TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
    20,
    40,
)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{_PREFIX}_requests",
            "Requests answered, by API and status.",
            ["api", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            f"{_PREFIX}_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            f"{_PREFIX}_inter_token_latency_seconds",
            "Between a request's consecutive responses from its worker.",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{_PREFIX}_e2e_request_latency_seconds",
            "From a request's arrival to its last byte.",
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(f"{_PREFIX}_prompt_tokens", "Prompt tokens.", registry=r)
        self.generation_tokens = Counter(
            f"{_PREFIX}_generation_tokens", "Generated tokens.", registry=r
        )
        self.cached_tokens = Counter(
            f"{_PREFIX}_cached_tokens",
            "Prompt tokens served from a worker's prefix cache.",
            registry=r,
        )
        self.routing_decisions = Counter(
            f"{_PREFIX}_routing_decisions", "Worker choices, by reason.", ["reason"], registry=r
        )
        for reason in REASONS:
            self.routing_decisions.labels(reason)
        self.migrations = Counter(
            f"{_PREFIX}_migrations",
            "Streams resumed on another worker after theirs failed mid-generation.",
            registry=r,
        )
        self.failovers = Counter(
            f"{_PREFIX}_failovers",
            "Worker failures that moved a started stream elsewhere, by reason: died "
            "(connection broke), stalled (--worker-stall-timeout), unavailable (the "
            "worker's own error status).",
            ["reason"],
            registry=r,
        )
        for reason in FAILOVER_REASONS:
            self.failovers.labels(reason)
        self.worker_restarts = Counter(
            f"{_PREFIX}_worker_restarts",
            "Workers `pagoda serve` started again after they died, by worker.",
            ["worker"],
            registry=r,
        )
        self.retries = Counter(
            f"{_PREFIX}_retries", "Requests moved to another worker after a failure.", registry=r
        )
        self.worker_in_flight = Gauge(
            f"{_PREFIX}_worker_in_flight", "Requests open with each worker.", ["worker"], registry=r
        )
        self.workers_serving = Gauge(
            f"{_PREFIX}_workers_serving", "Workers whose health is SERVING.", registry=r
        )
        self.store_up = Gauge(
            f"{_PREFIX}_store_up",
            "1 while the affinity store (Redis, or the in-process one) answers.",
            ["store"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
