#!/usr/bin/env bash
# One stream through `pagoda serve`, two source trees alternating in one run:
#   bench/serve_threads_ab.sh MODEL_DIR OLD_TREE NEW_TREE [OUT_DIR]
# Each pass starts `pagoda serve` (one worker) from one tree (PYTHONPATH=TREE),
# waits for it, warms up with 2 requests, then runs `pagoda bench serve` on
# WORKLOAD (default mixed) at CONCURRENCY (default 1) for NUM_REQUESTS (default 12) under
# bench/serve_threads.py: CPU time and run-queue wait per output token of every
# thread of the router and the worker, and the client's CPU. REPEAT rounds
# (default 3) of old, new, the order reversed every other round. Writes
# OUT/serve_threads.jsonl (label old/new) and prints a table with per-pair ratios.
set -euo pipefail
MODEL=${1:?usage: bench/serve_threads_ab.sh MODEL_DIR OLD_TREE NEW_TREE [OUT_DIR]}
OLD=${2:?old tree}
NEW=${3:?new tree}
OUT=${4:-bench/results/serve-threads}
# A port below the ephemeral range: each pass starts a server on it again.
PORT=${PORT:-$(python -c "from shared.ports import free_port_run; print(free_port_run())")}
REPEAT=${REPEAT:-3}
NUM_REQUESTS=${NUM_REQUESTS:-12}
WORKLOAD=${WORKLOAD:-mixed}
CONCURRENCY=${CONCURRENCY:-1}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
: >"$OUT/serve_threads.jsonl"

pass() {  # pass LABEL TREE
  local label=$1 tree=$2 url="http://127.0.0.1:$PORT"
  (cd "$tree" && PYTHONPATH=$tree exec python -m shared.cli serve "$MODEL" --port "$PORT" \
    --grpc-port 0) >"$OUT/serve-$label.log" 2>&1 &
  local server=$!
  for _ in $(seq 900); do
    curl -sf "$url/health" | grep -q '"workers_serving":1' && break
    sleep 1
  done
  PYTHONPATH=$HERE python -m shared.cli bench serve --base-url "$url" --workload "$WORKLOAD" \
    --num-requests 2 --concurrency 1 >/dev/null
  PYTHONPATH=$HERE python -m bench.serve_threads --server-pid "$server" --label "$label" \
    --output "$OUT/serve_threads.jsonl" -- --base-url "$url" --workload "$WORKLOAD" \
    --num-requests "$NUM_REQUESTS" --concurrency "$CONCURRENCY" --engine "$label" >/dev/null
  kill -INT "$server"
  wait "$server" || true
}

for round in $(seq "$REPEAT"); do
  if ((round % 2)); then
    pass old "$OLD"
    pass new "$NEW"
  else
    pass new "$NEW"
    pass old "$OLD"
  fi
done
PYTHONPATH=$HERE python -m bench.serve_threads_table "$OUT/serve_threads.jsonl"
