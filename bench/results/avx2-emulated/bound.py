"""A step profile's workload against a one-thread float32 peak.

    PYTHONPATH=. python bench/results/avx2-emulated/bound.py profile.jsonl [PEAK_GFLOPS]

Workload FLOPs (bench/model_flops.py) / the sum of its steps' CPU time
(`--clock thread`, one thread), as GFLOP/s and as a fraction of PEAK (default
114: oneDNN's AVX2 float32 linear on one Zen 5 thread, f32_linear_shapes.md).
"""

import json
import sys
from pathlib import Path

from bench.model_flops import ModelFlops
from bench.workloads import resolve_workloads
from worker.models.spec import ModelSpec

PEAK = float(sys.argv[2]) if len(sys.argv) > 2 else 114.0
d = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()][-1]
a = d["steps"]["all"]
cpu_s = a["count"] * sum(a["ms_per_step"].values()) / 1e3
spec = ModelSpec.from_folder(Path(d["model"]))
flops = ModelFlops.from_spec(spec)
w = resolve_workloads(d["workload"], vocab_size=spec.vocab_size)[0]
f = flops.workload_flops(w)
tokens = sum(len(r.prompt_token_ids) + r.max_tokens for r in w.requests)
print(
    f"{d['workload']}: {f / 1e12:.2f} TFLOP in {cpu_s:.1f} s of one thread's CPU = {f / cpu_s / 1e9:.1f} GFLOP/s, "
    f"{f / cpu_s / 1e9 / PEAK:.0%} of {PEAK:.0f}; {tokens / cpu_s:.0f} total tok/s per thread; elapsed_s {d['elapsed_s']}"
)
