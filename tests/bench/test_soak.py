"""bench/soak.py: its verdict rules, and (slow) a short soak against pagoda serve."""

from __future__ import annotations

import json

import pytest

from bench.soak import Sample, SoakResult, main, p99


def test_p99_and_the_verdict_name_what_did_not_hold():
    assert p99([float(i) for i in range(1, 101)]) == 100.0 and p99([]) == 0.0
    result = SoakResult(60, 4, kv_start=[0, 0], kv_end=[0, 0], p99_first_s=1.0, p99_last_s=1.1)
    assert result.verdict() == []
    result.kv_end, result.p99_last_s, result.failures = [0, 3], 1.3, ["whole: boom"]
    assert result.verdict() == [
        "1 failures, e.g. ['whole: boom']",
        "KV blocks in use [0, 0] at the start, [0, 3] at the end",
        "p99 1.000 s first, 1.300 s last",
    ]


@pytest.mark.slow
def test_a_short_soak_holds(tmp_path):
    out = tmp_path / "soak.json"
    code = main(["--duration=60", "--concurrency=16", "--sample-every=20", f"--out={out}"])
    summary = json.loads(out.read_text())
    assert code == 0, summary["verdict"]
    assert summary["kv_end"] == summary["kv_start"] and not summary["failures"]


def test_rss_growth_is_also_given_per_request():
    result = SoakResult(60, 4)
    result.samples = [
        Sample(10, 100.0, [400.0], [0], [0], 0),
        Sample(20, 101.0, [401.0], [0], [0], 1000),
        Sample(30, 102.0, [401.0], [0], [0], 3048),
    ]
    # The middle sample to the last: 1 MiB over 2,048 requests; the worker flat.
    assert result.rss_bytes_per_request() == {"router": 512.0, "worker 0": 0.0}
