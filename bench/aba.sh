#!/usr/bin/env bash
# Pagoda, then vLLM CPU, then Pagoda again, offline, on the same workloads:
#   bench/aba.sh MODEL_DIR [OUT_DIR]
# On a shared host the machine's speed drifts by 10-25% within minutes (measured
# memory bandwidth 21 vs 28 GB/s twenty minutes apart), and run_all.sh puts ten
# minutes of other runs between the two engines. Bracketing vLLM with two Pagoda
# passes shows the drift: compare vLLM with both passes, not with one.
# PAGODA_REPEAT runs each Pagoda pass that many times (a fresh process per run),
# VLLM_REPEAT runs vLLM's pass that many times in its one process; with repeats,
# ABA.md compares best with best and median with median.
# Writes OUT/pagoda_a.jsonl, OUT/vllm.jsonl, OUT/pagoda_b.jsonl and OUT/ABA.md.
set -euo pipefail
MODEL=${1:?usage: bench/aba.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-bench/results/aba}
VLLM_PY=${VLLM_PY:-/work/venvs/vllm/bin/python}
WORKLOADS=(mixed decode prefill shared-prefix chat)
BUDGET=(--max-num-batched-tokens 4096)
PAGODA=(python -m shared.cli)
mkdir -p "$OUT/workloads"
for w in "${WORKLOADS[@]}"; do
  "${PAGODA[@]}" bench workload "$w" --out "$OUT/workloads/$w.json"
done
files=("${WORKLOADS[@]/#/$OUT/workloads/}")
files=("${files[@]/%/.json}")
pagoda_pass() {
  for _ in $(seq "${PAGODA_REPEAT:-1}"); do
    for f in "${files[@]}"; do
      "${PAGODA[@]}" bench offline --model "$MODEL" --workload "$f" "${BUDGET[@]}" --output "$OUT/$1.jsonl"
    done
  done
}
pagoda_pass pagoda_a
# vLLM computes in the dtype Pagoda chose here (bf16 where the CPU has fast
# bf16, float32 elsewhere); VLLM_DTYPE overrides it.
DTYPE=${VLLM_DTYPE:-$(python -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["dtype"])' "$OUT/pagoda_a.jsonl")}
vllm_files=()
for _ in $(seq "${VLLM_REPEAT:-1}"); do vllm_files+=("${files[@]}"); done
"$VLLM_PY" bench/vllm_reference.py --model "$MODEL" --dtype "$DTYPE" "${BUDGET[@]}" \
  --workload "${vllm_files[@]}" --output "$OUT/vllm.jsonl"
pagoda_pass pagoda_b
python -m bench.aba_table "$OUT/pagoda_a.jsonl" "$OUT/vllm.jsonl" "$OUT/pagoda_b.jsonl" >"$OUT/ABA.md"
cat "$OUT/ABA.md"
