#!/usr/bin/env bash
# Every measured run behind the performance note, one engine at a time, in one go:
#   bench/run_all.sh MODEL_DIR [OUT_DIR]
# Run it on a quiet machine (nothing else on the cores). vLLM runs when its venv
# exists (docs/VLLM_REFERENCE.md; VLLM_PY overrides the path).
set -euo pipefail
MODEL=${1:?usage: bench/run_all.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-bench/results}
VLLM_PY=${VLLM_PY:-/work/venvs/vllm/bin/python}
PORT=${PORT:-8321}
WORKLOADS=(mixed decode prefill shared-prefix chat)
mkdir -p "$OUT/workloads"
PAGODA=(python -m shared.cli)
# Offline, both engines get vLLM's offline token budget per step (its LLM defaults
# to 4096 on CPU); served, both keep their server default (2048).
BUDGET=(--max-num-batched-tokens 4096)

for w in "${WORKLOADS[@]}"; do
  "${PAGODA[@]}" bench workload "$w" --out "$OUT/workloads/$w.json"
done
files=("${WORKLOADS[@]/#/$OUT/workloads/}")
files=("${files[@]/%/.json}")

echo "== roofline (machine peaks)" >&2
"${PAGODA[@]}" bench roofline --model "$MODEL" --workload all --output "$OUT/roofline.jsonl"

echo "== transformers static batches" >&2
"${PAGODA[@]}" bench offline --model "$MODEL" --workload "$OUT/workloads/mixed.json" \
  --baseline hf-static --batch 1 16 --output "$OUT/offline.jsonl"

# Pagoda, vLLM, then Pagoda again (offline_after.jsonl), back to back: the host's
# speed drifts within minutes, so ABA.md compares vLLM with both Pagoda passes.
pagoda_pass() {
  for f in "${files[@]}"; do  # a fresh engine per workload, as each would run alone
    "${PAGODA[@]}" bench offline --model "$MODEL" --workload "$f" "${BUDGET[@]}" --output "$1"
  done
}
echo "== pagoda offline" >&2
pagoda_pass "$OUT/offline.jsonl"
"${PAGODA[@]}" bench offline --model "$MODEL" --workload "$OUT/workloads/shared-prefix.json" \
  --no-enable-prefix-caching "${BUDGET[@]}" --output "$OUT/offline.jsonl"

if [[ -x "$VLLM_PY" ]]; then
  echo "== vLLM CPU" >&2
  # In the dtype Pagoda chose here (bf16 where the CPU has fast bf16, float32
  # elsewhere); VLLM_DTYPE overrides it.
  DTYPE=${VLLM_DTYPE:-$(python -c 'import json, sys; print([d for d in map(json.loads, open(sys.argv[1])) if d.get("engine") == "pagoda"][-1]["dtype"])' "$OUT/offline.jsonl")}
  "$VLLM_PY" bench/vllm_reference.py --model "$MODEL" --dtype "$DTYPE" "${BUDGET[@]}" \
    --workload "${files[@]}" --output "$OUT/offline.jsonl"
  "$VLLM_PY" bench/vllm_reference.py --model "$MODEL" --dtype "$DTYPE" "${BUDGET[@]}" \
    --workload "$OUT/workloads/shared-prefix.json" --no-enable-prefix-caching \
    --output "$OUT/offline.jsonl"
  echo "== pagoda offline, again" >&2
  pagoda_pass "$OUT/offline_after.jsonl"
  python -m bench.aba_table "$OUT/offline.jsonl" "$OUT/offline.jsonl" "$OUT/offline_after.jsonl" \
    >"$OUT/ABA.md"
fi

echo "== pagoda serve" >&2
"${PAGODA[@]}" serve "$MODEL" --port "$PORT" >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 1
done
for c in 1 16 64; do
  "${PAGODA[@]}" bench serve --base-url "http://127.0.0.1:$PORT" \
    --workload mixed --seed "$c" --concurrency "$c" --engine pagoda \
    --output "$OUT/serve.jsonl"
done

"${PAGODA[@]}" bench roofline --model "$MODEL" --workload all --result "$OUT/offline.jsonl" \
  --output "$OUT/roofline.jsonl"
"${PAGODA[@]}" bench summary "$OUT"/offline.jsonl "$OUT"/serve.jsonl "$OUT"/roofline.jsonl \
  >"$OUT/SUMMARY.md"
cat "$OUT/SUMMARY.md"
