"""oneDNN's kernel caches are bounded in a worker: linears over many token counts
(as a serving worker meets them) grow malloc's memory by their cache's capacity,
not by every shape ever met."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from worker.service.primitive_caches import CAPACITY_VARIABLES, bound_primitive_caches

# Linears over 400 token counts, as the worker runs them (bfloat16 through F.linear,
# float32 on a weight packed for oneDNN); malloc's in-use growth, in MB. Where the
# CPU lacks fast bf16 (AVX2-only), torch's bf16 linear is not oneDNN's and caches
# nothing, and the worker computes float32 there: only float32 is probed.
PROBE = """
import ctypes, json, sys
from worker.service.primitive_caches import bound_primitive_caches
bound_primitive_caches(int(sys.argv[1]))
import torch
from worker.runner.platform import cpu_has_fast_bf16
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
torch.set_num_threads(1)
def packed_float32(x, w):  # worker/layers/cpu_packed.py's float32 path
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
growth = {}
probes = [(torch.float32, packed_float32,
           torch.ops.mkldnn._reorder_linear_weight(torch.randn(256, 64), 64))]
if cpu_has_fast_bf16():
    probes.append((torch.bfloat16, torch.nn.functional.linear,
                   torch.randn(256, 64, dtype=torch.bfloat16)))
for dtype, linear, w in probes:
    linear(torch.randn(1, 64, dtype=dtype), w)
    before = libc.mallinfo2().uordblks
    for m in range(2, 402):
        linear(torch.randn(m, 64, dtype=dtype), w)
    growth[str(dtype)] = (libc.mallinfo2().uordblks - before) / 2**20
print(json.dumps(growth))
"""


def growth_mb(capacity: int, env: dict[str, str]) -> dict[str, float]:
    base = {k: v for k, v in os.environ.items() if k not in CAPACITY_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(capacity)],
        env={**base, "PYTHONPATH": os.getcwd(), **env},
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_the_caches_bound_what_new_shapes_cost():
    bounded = growth_mb(8, {})
    # Set in the environment, a capacity wins over the worker's: the defaults' growth.
    unbounded = growth_mb(8, {name: "1024" for name in CAPACITY_VARIABLES})
    assert all(mb < 16 for mb in bounded.values()), bounded
    assert all(mb > 4 * bounded[k] + 32 for k, mb in unbounded.items()), (bounded, unbounded)


def test_values_in_the_environment_win(monkeypatch):
    for name in CAPACITY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "3")
    assert bound_primitive_caches(256) == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256",
        "LRU_CACHE_CAPACITY": "3",
    }
