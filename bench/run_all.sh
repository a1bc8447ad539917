#!/usr/bin/env bash
# Every measured run behind the performance note, one engine at a time, in one go:
#   bench/run_all.sh MODEL_DIR OUT_DIR     (OUT_DIR: a fresh folder)
# Run it on a quiet machine (nothing else on the cores). vLLM runs when its venv
# exists (docs/VLLM_REFERENCE.md; VLLM_PY overrides the path): offline, then its
# OpenAI server at the same concurrencies as `pagoda serve`.
#   QUICK=1         smoke test of the whole script: the first QUICK_REQUESTS (6)
#                   requests of each workload, at most QUICK_MAX_TOKENS (16) output
#                   tokens each, vLLM eager (no 3.5 min compile), 1 GiB KV caches.
#                   Its figures mean nothing; it checks that every pass runs.
#   SKIP_HF=1       no transformers baselines (they take ~5 min).
#   PROFILE=0       no step profile of `mixed` (bench/step_profile.py).
#   SERVE_ROUNDS    rounds of the served passes, each Pagoda's server then vLLM's
#                   (default 2; QUICK 1): on a shared host one server's minutes can
#                   be slow (a Zen 3, 0b57fc3: c=64 1.12x in one pass, 1.63x and
#                   1.42x in two rounds after it), so the summary shows each
#                   round's ratios and the targets take their median.
#   VLLM_DTYPE      vLLM's dtype (default: the one Pagoda chose here).
#   STREAM_INTERVAL the served passes ask both engines for this many tokens per
#                   streamed chunk (vLLM's stream_interval field; default: none
#                   asked, each server's default of 1).
set -euo pipefail
MODEL=${1:?usage: bench/run_all.sh MODEL_DIR OUT_DIR}
OUT=${2:?usage: bench/run_all.sh MODEL_DIR OUT_DIR (a fresh folder)}
VLLM_PY=${VLLM_PY:-/work/venvs/vllm/bin/python}
PORT=${PORT:-8321}
VLLM_PORT=${VLLM_PORT:-8322}
QUICK=${QUICK:-0}
SERVE_ROUNDS=${SERVE_ROUNDS:-$([[ $QUICK == 1 ]] && echo 1 || echo 2)}
WORKLOADS=(mixed decode prefill shared-prefix chat)
CONCURRENCY=(1 16 64)
PAGODA=(python -m shared.cli)
CUT=()
INTERVAL=(${STREAM_INTERVAL:+--stream-interval "$STREAM_INTERVAL"})
VLLM_FLAGS=()
KV=()  # Pagoda's KV cache: its default (sized from free memory) unless QUICK
if [[ $QUICK == 1 ]]; then
  CUT=(--num-requests "${QUICK_REQUESTS:-6}" --max-tokens "${QUICK_MAX_TOKENS:-16}")
  VLLM_FLAGS=(--enforce-eager)
  # A smoke run shares the machine: small KV caches, so no engine meets the OOM killer.
  KV=(--kv-cache-memory 1GiB)
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
fi
if [[ -e $OUT/offline.jsonl || -e $OUT/serve.jsonl ]]; then
  # Result files are appended to, and the summary takes the last line per row.
  echo "error: $OUT already holds results; give a fresh OUT_DIR" >&2
  exit 2
fi
mkdir -p "$OUT/workloads"
# Offline, both engines get vLLM's offline token budget per step (its LLM defaults
# to 4096 on CPU); served, both keep their server default (2048).
BUDGET=(--max-num-batched-tokens 4096)

for w in "${WORKLOADS[@]}"; do
  "${PAGODA[@]}" bench workload "$w" "${CUT[@]}" --out "$OUT/workloads/$w.json"
done
files=("${WORKLOADS[@]/#/$OUT/workloads/}")
files=("${files[@]/%/.json}")
# Served: each concurrency draws its own seed, so one pass's prompts are not in
# the prefix cache of the next; both engines get the same files. The warm-up
# requests (never timed) share no block with them.
for c in "${CONCURRENCY[@]}"; do
  "${PAGODA[@]}" bench workload mixed --seed "$c" "${CUT[@]}" --out "$OUT/workloads/serve-mixed-c$c.json"
done
"${PAGODA[@]}" bench workload decode --seed 999 --num-requests 4 --max-tokens 8 \
  --out "$OUT/workloads/serve-warmup.json"

roofline() {  # the machine's peaks, each workload's bound; rates offline lines when given
  "${PAGODA[@]}" bench roofline --model "$MODEL" --workload "${files[@]}" "$@" \
    --output "$OUT/roofline.jsonl"
}
echo "== roofline (machine peaks)" >&2
roofline

if [[ ${SKIP_HF:-0} != 1 ]]; then
  echo "== transformers static batches" >&2
  "${PAGODA[@]}" bench offline --model "$MODEL" --workload "$OUT/workloads/mixed.json" \
    --baseline hf-static --batch 1 16 --output "$OUT/offline.jsonl"
fi

# Pagoda, vLLM, then Pagoda again (offline_after.jsonl), back to back: the host's
# speed drifts within minutes, so ABA.md compares vLLM with both Pagoda passes.
pagoda_pass() {
  for f in "${files[@]}"; do  # a fresh engine per workload, as each would run alone
    "${PAGODA[@]}" bench offline --model "$MODEL" --workload "$f" "${BUDGET[@]}" "${KV[@]}" \
      --output "$1"
  done
}
echo "== pagoda offline" >&2
pagoda_pass "$OUT/offline.jsonl"
"${PAGODA[@]}" bench offline --model "$MODEL" --workload "$OUT/workloads/shared-prefix.json" \
  --no-enable-prefix-caching "${BUDGET[@]}" "${KV[@]}" --output "$OUT/offline.jsonl"

# In the dtype Pagoda chose here (bf16 where the CPU has fast bf16, float32
# elsewhere), offline and served.
DTYPE=${VLLM_DTYPE:-$(python -c 'import json, sys; print([d for d in map(json.loads, open(sys.argv[1])) if d.get("engine") == "pagoda"][-1]["dtype"])' "$OUT/offline.jsonl")}
HAVE_VLLM=0
[[ -x "$VLLM_PY" ]] && HAVE_VLLM=1
if [[ $HAVE_VLLM == 1 ]]; then
  echo "== vLLM CPU offline" >&2
  "$VLLM_PY" bench/vllm_reference.py --model "$MODEL" --dtype "$DTYPE" "${BUDGET[@]}" \
    "${VLLM_FLAGS[@]}" --workload "${files[@]}" --output "$OUT/offline.jsonl"
  "$VLLM_PY" bench/vllm_reference.py --model "$MODEL" --dtype "$DTYPE" "${BUDGET[@]}" \
    "${VLLM_FLAGS[@]}" --workload "$OUT/workloads/shared-prefix.json" --no-enable-prefix-caching \
    --output "$OUT/offline.jsonl"
  echo "== pagoda offline, again" >&2
  pagoda_pass "$OUT/offline_after.jsonl"
  python -m bench.aba_table "$OUT/offline.jsonl" "$OUT/offline.jsonl" "$OUT/offline_after.jsonl" \
    >"$OUT/ABA.md"
else
  echo "warning: no vLLM at $VLLM_PY: no reference figures" >&2
fi

# --- served (bench/server_control.sh: start_server, stop_server)
source "$(dirname "${BASH_SOURCE[0]}")/server_control.sh"

serve_pass() {  # serve_pass PORT ENGINE: warm-up, then each concurrency
  local url=http://127.0.0.1:$1
  "${PAGODA[@]}" bench serve --base-url "$url" --workload "$OUT/workloads/serve-warmup.json" \
    --concurrency 2 --engine warmup >/dev/null || echo "warning: $2: warm-up failed" >&2
  for c in "${CONCURRENCY[@]}"; do
    # The one-stream row's bound: the read bandwidth of this minute (bench/targets.py).
    if [[ $c == 1 ]]; then
      "${PAGODA[@]}" bench roofline --memory-only --output "$OUT/roofline.jsonl" >/dev/null
    fi
    # A failed request is in the line (`failed`); the other passes still run.
    "${PAGODA[@]}" bench serve --base-url "$url" --workload "$OUT/workloads/serve-mixed-c$c.json" \
      --concurrency "$c" --engine "$2" "${INTERVAL[@]}" --output "$OUT/serve.jsonl" ||
      echo "warning: $2 at concurrency $c had failed requests" >&2
  done
}

if [[ $HAVE_VLLM == 1 ]]; then
  "$VLLM_PY" bench/vllm_reference.py --model "$MODEL" --dtype "$DTYPE" --port "$VLLM_PORT" \
    "${VLLM_FLAGS[@]}" --serve-args >"$OUT/vllm_serve_command.txt"
fi
for round in $(seq "$SERVE_ROUNDS"); do
  # Round 1's logs are serve.log / vllm_serve.log; later rounds' carry their number.
  suffix=$([[ $round == 1 ]] || echo ".round$round")
  echo "== pagoda serve (round $round of $SERVE_ROUNDS)" >&2
  # --grpc-port 0: the text gRPC API on any free port (the default one may be taken).
  start_server "$PORT" "$OUT/serve$suffix.log" "${PAGODA[@]}" serve "$MODEL" --port "$PORT" \
    --grpc-port 0 "${KV[@]}"
  serve_pass "$PORT" pagoda
  stop_server

  if [[ $HAVE_VLLM == 1 ]]; then
    echo "== vLLM serve, its server defaults (round $round of $SERVE_ROUNDS)" >&2
    start_server "$VLLM_PORT" "$OUT/vllm_serve$suffix.log" "$VLLM_PY" bench/vllm_reference.py \
      --model "$MODEL" --dtype "$DTYPE" --port "$VLLM_PORT" "${VLLM_FLAGS[@]}" --serve
    serve_pass "$VLLM_PORT" vllm-cpu
    stop_server
  fi
done

if [[ ${PROFILE:-1} == 1 ]]; then
  # Wall time with the engine's threads (the quiet-machine figure), then one
  # thread's CPU time (comparable with a profile taken on a loaded machine).
  echo "== step profile of mixed" >&2
  : >"$OUT/profile.md"
  for clock in wall thread; do
    "${PAGODA[@]}" bench profile --model "$MODEL" --workload "$OUT/workloads/mixed.json" \
      "${BUDGET[@]}" "${KV[@]}" --clock "$clock" --output "$OUT/profile.jsonl" >>"$OUT/profile.md"
  done
fi

echo "== roofline again, rating the offline lines" >&2
roofline --result "$OUT/offline.jsonl"
summary_files=("$OUT"/offline.jsonl "$OUT"/serve.jsonl "$OUT"/roofline.jsonl)
[[ -f $OUT/profile.jsonl ]] && summary_files+=("$OUT/profile.jsonl")
"${PAGODA[@]}" bench summary "${summary_files[@]}" >"$OUT/SUMMARY.md"
cat "$OUT/SUMMARY.md"
