#!/usr/bin/env bash
# One stream through `pagoda serve` under OpenMP wait policies, alternating in one run:
#   bench/serve_omp_ab.sh MODEL_DIR [OUT_DIR]
# At concurrency 1 on a 2-core machine the router and the gRPC threads share the
# cores with the worker's OpenMP team; libgomp's default lets an idle team thread
# spin ~300k rounds before it sleeps, so the second thread spins through every gap
# between a step's kernels. Labels (VARIANTS, default "default passive spin10k"):
#   default   OMP_WAIT_POLICY / GOMP_SPINCOUNT unset (the worker today)
#   passive   OMP_WAIT_POLICY=PASSIVE: idle team threads sleep at once
#   spin10k   GOMP_SPINCOUNT=10000: spin briefly, then sleep
#   active    OMP_WAIT_POLICY=ACTIVE: spin forever
# Each pass starts its own `pagoda serve` (one worker) with that environment, waits
# for it, warms up with 2 requests, then runs `pagoda bench serve --workload decode`
# at concurrency 1 (NUM_REQUESTS, default 6), noting the serving processes' CPU
# seconds over it (bench/serve_omp_cpu.py) and the load; REPEAT rounds (default 3),
# the order reversed every other round. Writes OUT/serve_omp.jsonl (bench serve
# lines, engine = label) and OUT/serve_omp_cpu.jsonl, and prints a table.
set -euo pipefail
MODEL=${1:?usage: bench/serve_omp_ab.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-bench/results/serve-omp}
# A port below the ephemeral range: each pass starts a server on it again.
PORT=${PORT:-$(python -c "from shared.ports import free_port_run; print(free_port_run())")}
REPEAT=${REPEAT:-3}
NUM_REQUESTS=${NUM_REQUESTS:-6}
read -r -a VARIANTS <<<"${VARIANTS:-default passive spin10k}"
PAGODA=(python -m shared.cli)
mkdir -p "$OUT"
: >"$OUT/serve_omp.jsonl"
: >"$OUT/serve_omp_cpu.jsonl"

env_for() {  # the environment of one label, as `env` arguments
  case $1 in
    default) echo "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT" ;;
    passive) echo "-u GOMP_SPINCOUNT OMP_WAIT_POLICY=PASSIVE" ;;
    spin10k) echo "-u OMP_WAIT_POLICY GOMP_SPINCOUNT=10000" ;;
    active) echo "-u GOMP_SPINCOUNT OMP_WAIT_POLICY=ACTIVE" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

pass() {  # pass LABEL
  local label=$1 url="http://127.0.0.1:$PORT"
  # shellcheck disable=SC2046
  env $(env_for "$label") "${PAGODA[@]}" serve "$MODEL" --port "$PORT" --grpc-port 0 \
    >"$OUT/serve-$label.log" 2>&1 &
  local server=$!
  for _ in $(seq 900); do
    curl -sf "$url/health" | grep -q '"workers_serving":1' && break
    sleep 1
  done
  "${PAGODA[@]}" bench serve --base-url "$url" --workload decode --num-requests 2 \
    --concurrency 1 >/dev/null
  local cpu0
  cpu0=$(python -m bench.serve_omp_cpu "$server")
  "${PAGODA[@]}" bench serve --base-url "$url" --workload decode --num-requests "$NUM_REQUESTS" \
    --concurrency 1 --engine "$label" --output "$OUT/serve_omp.jsonl" >/dev/null
  echo "{\"cpu_s\": $(python -m bench.serve_omp_cpu "$server" "$cpu0"), \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\"}" \
    >>"$OUT/serve_omp_cpu.jsonl"
  kill -INT "$server"
  wait "$server" || true
}

for round in $(seq "$REPEAT"); do
  order=("${VARIANTS[@]}")
  if ((round % 2 == 0)); then
    for ((i = ${#VARIANTS[@]} - 1, j = 0; i >= 0; i--, j++)); do order[j]=${VARIANTS[i]}; done
  fi
  for label in "${order[@]}"; do pass "$label"; done
done
python - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [json.loads(line) for line in open(f"{out}/serve_omp.jsonl")]
cpu = [json.loads(line) for line in open(f"{out}/serve_omp_cpu.jsonl")]
print("| pass | policy | TPOT p50 ms | decode tok/s (1000/TPOT) | CPU s/request | load |")
print("|---|---|---:|---:|---:|---|")
for i, (r, c) in enumerate(zip(rows, cpu)):
    tpot = r["tpot_ms"]["p50"]
    per_request = c["cpu_s"] / max(r["completed"], 1)
    print(f"| {i + 1} | {r['engine']} | {tpot:.2f} | {1000 / tpot:.1f} "
          f"| {per_request:.3f} | {c['load']} |")
for label in dict.fromkeys(r["engine"] for r in rows):
    tpots = [r["tpot_ms"]["p50"] for r in rows if r["engine"] == label]
    print(f"\n{label}: TPOT p50 median {statistics.median(tpots):.2f} ms over {len(tpots)} passes")
PY
