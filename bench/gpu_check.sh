#!/usr/bin/env bash
# The GPU device check: the `gpu`-marked tests, then bench/gpu_check.py (mixed and
# decode at batch 1/16/64, CUDA graphs vs --enforce-eager, HBM roofline fraction).
# Usage: bench/gpu_check.sh RESULTS_DIR      (from the repository root)
# Needs: a CUDA GPU, PyTorch (2.11 or later) with Triton (3.6 or later), numpy,
# safetensors, transformers, pytest (+ pytest-timeout): the packages of
# pyproject.toml's dependencies that the engine imports; wheel files placed in
# ./wheels/ beside the tree are installed first, without the network.
# No network is used. Finishes within 8 minutes: the tests are cut at 5 minutes and
# the benchmarks at 3 (whatever they wrote by then stays in RESULTS_DIR; on an H200
# the benchmarks took ~100 s and the engine exactness tests alone over 165 s).
# PYTHON names the interpreter that holds PyTorch; else the first of python3 and
# python that imports torch (on the lent H200: PATH=/opt/torch/.venv/bin:$PATH).
set -euo pipefail
out=${1:?usage: bench/gpu_check.sh RESULTS_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    for candidate in python3 python; do
        if "$candidate" -c "import torch" 2>/dev/null; then PYTHON=$candidate; break; fi
    done
fi
"${PYTHON:?no python3 or python here imports torch: set PYTHON=/path/to/python}" -c "import triton"
python() { "$PYTHON" "$@"; }
if compgen -G "wheels/*.whl" >/dev/null; then
    python -m pip install --no-index --no-deps wheels/*.whl 2>&1 | tail -1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
python - <<'PY' | tee "$out/environment.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__)
print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
PY
echo "== gpu tests" | tee "$out/gpu_tests.txt"
timeout 300 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider -o addopts="" -rfEs --tb=short \
    tests/kernels tests/worker/test_exactness_triton.py 2>&1 | tee -a "$out/gpu_tests.txt" || true
echo "== benchmarks"
timeout 180 "$PYTHON" -m bench.gpu_check --out "$out" 2>&1 | tee "$out/gpu_check.log" || true
python - "$out/gpu_check.jsonl" <<'PY' | tee "$out/summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    if r["kind"] == "copy_bandwidth":
        print(f"copy bandwidth {r['bytes_per_s'] / 1e12:.2f} TB/s on {r['device']}")
    elif r["kind"] == "mixed":
        print(f"mixed  graphs={r['cuda_graphs']!s:5}  {r['output_tokens_per_s']:9.0f} out tok/s")
    else:
        print(
            f"decode b={r['batch']:<3} graphs={r['cuda_graphs']!s:5}  {r['output_tokens_per_s']:9.0f}"
            f" out tok/s  step {r['step_ms']:.2f} ms  roofline {100 * r['hbm_roofline_fraction']:.0f}%"
        )
PY
