#!/usr/bin/env bash
# Served `mixed` with every token streamed vs INTERVAL tokens a chunk, both engines:
#   bench/serve_interval_ab.sh MODEL_DIR OUT_DIR [INTERVAL (default 8)]
# Per round: Pagoda's server (`pagoda serve MODEL`, its defaults), then vLLM's
# (bench/vllm_reference.py --serve, when its venv exists); on each, a warm-up,
# then at each concurrency (CONCURRENCY, default "1 16 64") `mixed` requests
# asking 1 token a chunk and INTERVAL (the request's stream_interval, vLLM's
# field, which both servers take). No pass may find another's prompts in the
# prefix cache, so each interval gets its own requests on a server: run_all's
# (seed c) and a second set (seed c + 1000), crossed over between rounds (round
# 1: interval 1 on the first, INTERVAL on the second; round 2 the other way),
# and the order of the two passes flipped too. ROUNDS (default 2, keep it even);
# VLLM_DTYPE (default bfloat16: set it to the dtype Pagoda chose where that is
# float32). Writes OUT_DIR/serve.jsonl (bench serve lines, `stream_interval` and
# `seed` in each) and OUT_DIR/SUMMARY.md. Run it on a quiet machine.
set -euo pipefail
MODEL=${1:?usage: bench/serve_interval_ab.sh MODEL_DIR OUT_DIR [INTERVAL]}
OUT=${2:?usage: bench/serve_interval_ab.sh MODEL_DIR OUT_DIR [INTERVAL]}
INTERVAL=${3:-8}
ROUNDS=${ROUNDS:-2}
read -r -a CONCURRENCY <<<"${CONCURRENCY:-1 16 64}"
VLLM_PY=${VLLM_PY:-/work/venvs/vllm/bin/python}
PORT=${PORT:-8331}
PAGODA=(python -m shared.cli)
cd "$(dirname "$0")/.."
mkdir -p "$OUT/workloads"
for c in "${CONCURRENCY[@]}"; do
  "${PAGODA[@]}" bench workload mixed --seed "$c" --out "$OUT/workloads/serve-mixed-c$c-a.json"
  "${PAGODA[@]}" bench workload mixed --seed "$((c + 1000))" \
    --out "$OUT/workloads/serve-mixed-c$c-b.json"
done
"${PAGODA[@]}" bench workload decode --seed 999 --num-requests 4 --max-tokens 8 \
  --out "$OUT/workloads/serve-warmup.json"

source bench/server_control.sh  # start_server PORT LOG CMD..., stop_server (cwd: the repo)

serve_pass() {  # serve_pass ENGINE ROUND
  local url=http://127.0.0.1:$PORT passes=("1 a" "$INTERVAL b")
  (($2 % 2 == 0)) && passes=("$INTERVAL a" "1 b")
  "${PAGODA[@]}" bench serve --base-url "$url" --workload "$OUT/workloads/serve-warmup.json" \
    --concurrency 2 --engine warmup >/dev/null
  for c in "${CONCURRENCY[@]}"; do
    for pass in "${passes[@]}"; do
      read -r interval set <<<"$pass"
      "${PAGODA[@]}" bench serve --base-url "$url" \
        --workload "$OUT/workloads/serve-mixed-c$c-$set.json" --concurrency "$c" \
        --engine "$1" --stream-interval "$interval" --output "$OUT/serve.jsonl" ||
        echo "warning: $1 c=$c interval $interval failed" >&2
    done
  done
}

for round in $(seq "$ROUNDS"); do
  echo "== pagoda serve (round $round of $ROUNDS)" >&2
  start_server "$PORT" "$OUT/serve.round$round.log" "${PAGODA[@]}" serve "$MODEL" --port "$PORT" \
    --grpc-port 0
  serve_pass pagoda "$round"
  stop_server
  if [[ -x $VLLM_PY ]]; then
    echo "== vLLM serve (round $round of $ROUNDS)" >&2
    start_server "$PORT" "$OUT/vllm_serve.round$round.log" "$VLLM_PY" bench/vllm_reference.py \
      --model "$MODEL" --dtype "${VLLM_DTYPE:-bfloat16}" --port "$PORT" --serve
    serve_pass vllm-cpu "$round"
    stop_server
  fi
done
"${PAGODA[@]}" bench summary "$OUT/serve.jsonl" >"$OUT/SUMMARY.md"
