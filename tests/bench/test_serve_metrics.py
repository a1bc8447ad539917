"""vLLM's serving definitions on hand-made request records."""

from __future__ import annotations

import pytest

from bench.serve_metrics import RequestRecord, distribution_ms, summarize


def test_definitions_by_hand():
    a = RequestRecord(10, 4, success=True, ttft=0.1, latency=0.4, itl=[0.1, 0.1, 0.1])
    a.output_tokens, a.cached_tokens = 4, 8
    b = RequestRecord(20, 2, success=True, ttft=0.3, latency=0.5, itl=[0.2], output_tokens=2)
    b.cached_tokens = 0
    c = RequestRecord(5, 1, success=True, ttft=0.2, latency=0.2, output_tokens=1)
    failed = RequestRecord(7, 3, error="HTTP 503: busy")
    summary = summarize([a, b, c, failed], duration_s=2.0)
    assert (summary["completed"], summary["failed"]) == (3, 1)
    assert summary["first_error"] == "HTTP 503: busy"
    assert (summary["total_input_tokens"], summary["total_output_tokens"]) == (35, 7)
    assert summary["expected_output_tokens"] == 10 and summary["cached_tokens"] == 8
    assert summary["request_throughput"] == 1.5
    assert (summary["output_throughput"], summary["total_token_throughput"]) == (3.5, 21.0)
    # TPOT: (0.4 - 0.1) / 3 and (0.5 - 0.3) / 1; c has one token and no TPOT.
    assert summary["tpot_ms"]["mean"] == pytest.approx((100 + 200) / 2)
    assert summary["ttft_ms"]["p50"] == pytest.approx(200)
    assert summary["itl_ms"]["mean"] == pytest.approx(125)  # 4 gaps pooled
    assert summary["e2el_ms"]["p99"] == pytest.approx(400 + 0.98 * 100)


def test_percentiles_interpolate_like_numpy_and_empty_is_none():
    figures = distribution_ms([0.001 * v for v in range(1, 11)])  # 1 .. 10 ms
    assert figures == {"mean": 5.5, "p50": 5.5, "p90": 9.1, "p99": 9.91}
    assert distribution_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
