#!/usr/bin/env bash
# pagoda serve --num-workers 2 before and after the core fix, alternating in one run:
#   bench/serve_cores.sh MODEL_DIR [OUT_DIR]
# "shared": both workers on core 0 (--cpu-cores 0), as every worker was before the
# fix (each pinned its compute thread to the machine's first core); "disjoint": the
# default, one core set per worker. Each pass starts its own `pagoda serve`, waits
# for both workers, runs `pagoda bench serve` on `mixed` at concurrency 16 and stops
# it; REPEAT (default 2) rounds of shared, disjoint. Writes OUT/serve_cores.jsonl and
# OUT/serve_cores.md (output tokens/s per pass, and the disjoint/shared ratio).
set -euo pipefail
MODEL=${1:?usage: bench/serve_cores.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-bench/results/serve-cores}
# A port below the ephemeral range: each pass starts a server on it again.
PORT=${PORT:-$(python -c "from shared.ports import free_port_run; print(free_port_run())")}
REPEAT=${REPEAT:-2}
PAGODA=(python -m shared.cli)
mkdir -p "$OUT"
"${PAGODA[@]}" bench workload mixed --out "$OUT/mixed.json"
: >"$OUT/serve_cores.jsonl"

pass() {  # pass LABEL [serve flags...]
  local label=$1
  shift
  "${PAGODA[@]}" serve "$MODEL" --num-workers 2 --port "$PORT" --grpc-port 0 "$@" \
    >"$OUT/serve-$label.log" 2>&1 &
  local server=$!
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"workers_serving":2' && break
    sleep 1
  done
  "${PAGODA[@]}" bench serve --base-url "http://127.0.0.1:$PORT" --workload "$OUT/mixed.json" \
    --concurrency 16 --engine "$label" --output "$OUT/serve_cores.jsonl"
  kill -INT "$server"
  wait "$server" || true
}

for _ in $(seq "$REPEAT"); do
  pass shared --cpu-cores 0
  pass disjoint
done
python - "$OUT/serve_cores.jsonl" >"$OUT/serve_cores.md" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| pass | engine | output tok/s | TPOT p50 ms | TTFT p50 ms | failed |")
print("|---|---|---|---|---|---|")
for i, r in enumerate(rows):
    print(f"| {i + 1} | {r['engine']} | {r['output_throughput']} | {r['tpot_ms']['p50']} "
          f"| {r['ttft_ms']['p50']} | {r['failed']} |")
by = {e: [r["output_throughput"] for r in rows if r["engine"] == e] for e in ("shared", "disjoint")}
ratio = statistics.median(by["disjoint"]) / statistics.median(by["shared"])
print(f"\ndisjoint / shared output throughput (medians): {ratio:.2f}x")
PY
cat "$OUT/serve_cores.md"
