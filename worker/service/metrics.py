"""The worker's Prometheus metrics, under vLLM's names, types, labels and buckets.

A dashboard built for vLLM reads a worker unchanged: every series is
`vllm:*` with labels `model_name` and `engine` ("0"), and histograms keep
vLLM's buckets. Served on `--metrics-port` (GET /metrics); `pagoda serve`
gives each worker one and its router's /metrics shows them all.

Fed by the engine thread, which alone sees the steps: `added` when a request
enters the engine, `stepped` after each step, `aborted` when one is dropped.
Per sample (a request with n samples is n engine requests, as in vLLM):

```
arrival ── queued ──► first scheduled ── prefill ──► first token ── decode ──► last token
|<──────────────── time to first token ────────────>|<── inter-token gaps ──>|
|<─────────────────────────────── e2e ──────────────────────────────────────>|
```

"First scheduled" is the start of the first step after which the request has
computed tokens (prefix hits included).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.logging import get_logger
from worker.stats import SchedulerStats

if TYPE_CHECKING:
    from worker.engine.engine_core import EngineStepOutput
    from worker.scheduler.scheduler import Scheduler

# vLLM's finish reasons, each with a series from the start.
FINISH_REASONS = ("stop", "length", "abort")
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


logger = get_logger(__name__)


def _never_raises(method: Callable) -> Callable:
    """Metrics run on the engine thread between steps: a bug in them must cost a
    log line, never the engine."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            method(self, *args, **kwargs)
        except Exception:
            if not self.has_failed:
                logger.exception("metrics failed (the engine goes on; metrics may be off)")
            self.has_failed = True

    return guarded


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


@dataclass
class _Sample:
    arrival: float
    child_id: str  # the scheduler's id of this sample
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_prompt_tokens: int = 0
    num_generated: int = 0


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        labels = ["model_name", "engine"]
        values = (model_name, "0")
        r = registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"vllm:{name}", doc, labels, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"vllm:{name}", doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"vllm:{name}", doc, labels, buckets=buckets, registry=r).labels(
                *values
            )

        self.running = gauge(
            "num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        # vLLM still serves the old name beside it, and its example dashboard reads it.
        self.gpu_cache_usage = gauge(
            "gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage. "
            "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
        )
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        token_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _ITERATION_TOKEN_BUCKETS,
        )
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        # The same gaps under the older name vLLM's example dashboard reads (as vLLM does).
        self.tpot = histogram(
            "time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            _ITL_BUCKETS,
        )
        self.max_generation_tokens = histogram(
            "request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        timings = {
            "e2e": ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
            "queue": ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
            "inference": ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
            "prefill": ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
            "decode": ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
        }  # fmt: skip
        self.timings = {
            key: histogram(name, doc, _REQUEST_LATENCY_BUCKETS)
            for key, (name, doc) in timings.items()
        }
        # engine id -> sample index -> its times; and the samples not scheduled yet
        self._requests: dict[str, dict[int, _Sample]] = {}
        self._unscheduled: list[_Sample] = []
        self._most_generated: dict[str, int] = {}  # engine id -> its longest sample so far
        self.has_failed = False
        self._last: SchedulerStats | None = None

    # ---- the engine thread ---------------------------------------------------------

    @_never_raises
    def start_counting(self, stats: SchedulerStats) -> None:
        """Cumulative engine counts from here on (the warm-up is not traffic)."""
        self._last = stats
        self._set_gauges(stats)

    @_never_raises
    def added(self, engine_id: str, num_samples: int) -> None:
        now = time.monotonic()
        ids = [engine_id] if num_samples == 1 else [f"{engine_id}#{i}" for i in range(num_samples)]
        samples = {i: _Sample(now, child_id) for i, child_id in enumerate(ids)}
        self._requests[engine_id] = samples
        self._unscheduled.extend(samples.values())

    @_never_raises
    def aborted(self, engine_id: str) -> None:
        samples = self._requests.pop(engine_id, None)
        self._most_generated.pop(engine_id, None)
        if samples is not None:
            self.success["abort"].inc(len(samples))
            gone = set(map(id, samples.values()))
            self._unscheduled = [s for s in self._unscheduled if id(s) not in gone]

    @_never_raises
    def idle(self, stats: SchedulerStats) -> None:
        """No step followed a change (the last request was aborted): gauges only."""
        self._count_engine(stats)

    @_never_raises
    def stepped(self, started: float, output: EngineStepOutput, scheduler: Scheduler) -> None:
        now = time.monotonic()
        self._count_engine(output.stats)
        self.iteration_tokens.observe(output.stats.num_scheduled_tokens)
        if self._unscheduled:
            waiting = []
            for sample in self._unscheduled:
                state = scheduler.requests.get(sample.child_id)
                if state is None or state.num_computed_tokens > 0:  # None: done already
                    sample.scheduled = started
                else:
                    waiting.append(sample)
            self._unscheduled = waiting
        for delta in output.deltas:
            samples = self._requests.get(delta.request_id)
            sample = samples.get(delta.index) if samples is not None else None
            if sample is None:
                continue
            if delta.new_token_ids:
                self._tokens(sample, len(delta.new_token_ids), delta.num_prompt_tokens, now)
            if delta.finished:
                self._finished(sample, delta.finish_reason, now)
                del samples[delta.index]
                most = max(self._most_generated.pop(delta.request_id, 0), sample.num_generated)
                if samples:
                    self._most_generated[delta.request_id] = most
                else:
                    del self._requests[delta.request_id]
                    self.max_generation_tokens.observe(most)

    def _tokens(self, sample: _Sample, num_new: int, num_prompt: int, now: float) -> None:
        if sample.first_token is None:
            sample.first_token = now
            sample.num_prompt_tokens = num_prompt
            self.prompt_tokens.inc(num_prompt)
            self.ttft.observe(now - sample.arrival)
        else:
            self.itl.observe(now - sample.last_token)
            self.tpot.observe(now - sample.last_token)
        sample.last_token = now
        sample.num_generated += num_new
        self.generation_tokens.inc(num_new)

    def _finished(self, sample: _Sample, reason: str | None, now: float) -> None:
        self.success[reason if reason in self.success else "stop"].inc()
        scheduled = sample.scheduled if sample.scheduled is not None else sample.arrival
        first = sample.first_token if sample.first_token is not None else now
        last = sample.last_token if sample.last_token is not None else now
        timings = self.timings
        timings["e2e"].observe(now - sample.arrival)
        timings["queue"].observe(scheduled - sample.arrival)
        timings["prefill"].observe(first - scheduled)
        timings["decode"].observe(last - first)
        timings["inference"].observe(last - scheduled)
        self.request_prompt_tokens.observe(sample.num_prompt_tokens)
        self.request_generation_tokens.observe(sample.num_generated)

    def _count_engine(self, stats: SchedulerStats) -> None:
        last = self._last
        if last is not None:
            self.prefix_queries.inc(max(stats.prefix_cache_queries - last.prefix_cache_queries, 0))
            self.prefix_hits.inc(max(stats.prefix_cache_hits - last.prefix_cache_hits, 0))
            self.preemptions.inc(max(stats.num_preemptions - last.num_preemptions, 0))
        self._last = stats
        self._set_gauges(stats)

    def _set_gauges(self, stats: SchedulerStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.gpu_cache_usage.set(stats.kv_usage)
