"""Serving metrics with `vllm bench serve`'s definitions, so the figures compare.

Per request, timed at the client from just before the HTTP request is sent
(vllm/benchmarks/lib/endpoint_request_func.py, vllm/benchmarks/serve.py):

    TTFT   arrival of the first stream chunk that carries a choice
    ITL    the gap between consecutive choice chunks (a chunk may hold several
           tokens; every gap of every request is one sample)
    E2EL   arrival of the last choice chunk (the usage chunk does not count)
    TPOT   (E2EL - TTFT) / (output_tokens - 1), for requests of > 1 output token

Output tokens are the server's `usage.completion_tokens`. Mean, p50, p90, p99
(numpy's linear-interpolation percentiles) over successful requests. Throughputs
are per second of `duration`: from the first request sent to the last one ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it; filled in while its stream arrives."""

    prompt_len: int
    max_tokens: int
    success: bool = False
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # seconds: the E2EL
    itl: list[float] = field(default_factory=list)  # seconds
    output_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    error: str = ""


def distribution_ms(values_s: list[float]) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds (all None without samples)."""
    import numpy as np

    keys = ["mean", *(f"p{p}" for p in PERCENTILES)]
    if not values_s:
        return dict.fromkeys(keys)
    ms = np.asarray(values_s) * 1000
    figures = [float(ms.mean()), *(float(np.percentile(ms, p)) for p in PERCENTILES)]
    return {k: round(v, 3) for k, v in zip(keys, figures)}


def summarize(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    done = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    total_input = sum(r.prompt_len for r in done)
    total_output = sum(r.output_tokens for r in done)
    cached = [r.cached_tokens for r in done if r.cached_tokens is not None]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "completed": len(done),
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "duration_s": round(duration_s, 4),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "expected_output_tokens": sum(r.max_tokens for r in records),
        "cached_tokens": sum(cached) if cached else None,
        "request_throughput": round(len(done) / duration_s, 4),
        "output_throughput": round(total_output / duration_s, 2),
        "total_token_throughput": round((total_input + total_output) / duration_s, 2),
        "ttft_ms": distribution_ms([r.ttft for r in done]),
        "tpot_ms": distribution_ms(tpots),
        "itl_ms": distribution_ms([gap for r in done for gap in r.itl]),
        "e2el_ms": distribution_ms([r.latency for r in done]),
    }
