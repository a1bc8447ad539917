"""The summary table from hand-written result lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.report import summarize_files
from tests.cluster import REPO_ROOT

MACHINE = {"cpu": "Test CPU", "cores": 2, "torch": "2.13.0", "load_avg_1m": 0.1}


def offline(engine, workload, total, output, elapsed, **extra):
    return {
        "kind": "offline",
        "engine": engine,
        "workload": workload,
        "dtype": "float32",
        "total_tokens_per_s": total,
        "output_tokens_per_s": output,
        "elapsed_s": elapsed,
        "machine": {**MACHINE, "load_avg_1m": elapsed},  # load differs: same machine
        **extra,
    }


LINES = [
    offline("hf-static-B16", "mixed", 200.0, 70.0, 60.0),
    offline("pagoda", "mixed", 300.0, 100.0, 40.0),  # replaced by the later line
    offline("pagoda", "mixed", 800.0, 300.0, 15.0, kv_waste=0.031, prefix_cache_hit_rate=0.0),
    {"engine": "vllm", "workload": "mixed", "total_tokens_per_s": 500.0,
     "output_tokens_per_s": 180.0, "elapsed_s": 24.0},  # a reference runner: no kind
    {"kind": "roofline", "workload": "mixed",
     "bound_total_tokens_per_s": {"float32": 1600.0, "bfloat16": 800.0}},
    offline("pagoda", "shared-prefix", 3000.0, 100.0, 5.0, prefix_caching=True),
    offline("pagoda", "shared-prefix", 500.0, 20.0, 25.0, prefix_caching=False),
    {"kind": "serve", "engine": "pagoda", "workload": "chat", "concurrency": 16,
     "request_rate": None, "ttft_ms": {"p50": 120.0, "p99": 480.5},
     "tpot_ms": {"p50": 30.0, "p99": 41.25}, "itl_ms": {"p50": 29.0},
     "output_throughput": 250.0, "total_token_throughput": 1400.0,
     "request_throughput": 3.5, "cached_tokens": 2048, "failed": 0},
]  # fmt: skip

EXPECTED = """\
### mixed

| engine | dtype | total tok/s | output tok/s | vs hf B16 | vs vLLM | of fp32 bound | of bf16 bound | KV waste | prefix hits | elapsed s |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| hf-static-B16 | float32 | 200.0 | 70.0 | 1.00x | 0.40x | 12% | 25% | - | - | 60.00 |
| pagoda | float32 | 800.0 | 300.0 | 4.00x | 1.60x | 50% | 100% | 3.1% | 0% | 15.00 |
| vllm | - | 500.0 | 180.0 | 2.50x | 1.00x | 31% | 62% | - | - | 24.00 |

### shared-prefix

| engine | dtype | total tok/s | output tok/s | vs hf B16 | vs vLLM | of fp32 bound | of bf16 bound | KV waste | prefix hits | elapsed s |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| pagoda | float32 | 3000.0 | 100.0 | - | - | - | - | - | - | 5.00 |
| pagoda (no prefix cache) | float32 | 500.0 | 20.0 | - | - | - | - | - | - | 25.00 |

pagoda: cached / uncached time = 0.20 (5.00 s / 25.00 s)

### serving

| workload | engine | load | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 ms | output tok/s | total tok/s | req/s | cached tokens | failed |
|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|
| chat | pagoda | c=16 | 120.0 / 480.5 | 30.0 / 41.2 | 29.0 | 250.0 | 1400.0 | 3.50 | 2048 | 0 |

### targets (issue 22)

| target | measured | goal | met |
|---|---|---|---|
| mixed: vs vLLM offline | 1.60x | >= 1.5x | yes |
| shared-prefix: cached / uncached time | 0.20 | <= 0.17 (AVX2) | **no** |
"""


def test_summary_table(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("log line, not a result\n" + "\n".join(json.dumps(r) for r in LINES) + "\n")
    assert summarize_files([str(path)]) == EXPECTED
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "shared.cli", "bench", "summary", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXPECTED


def test_machine_note_only_for_other_hardware(tmp_path):
    same = [
        offline("pagoda", "mixed", 800.0, 300.0, 15.0),
        # A serve client reports no torch; vLLM's venv has its own.
        offline("vllm-cpu", "mixed", 700.0, 250.0, 17.0, machine={"cpu": "Test CPU", "cores": 2}),
    ]
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in same))
    assert "different machines" not in summarize_files([str(path)])
    other = [*same, offline("x", "mixed", 1.0, 1.0, 1.0, machine={"cpu": "Other", "cores": 8})]
    path.write_text("".join(json.dumps(r) + "\n" for r in other))
    assert "these lines come from 2 different machines" in summarize_files([str(path)])
