#!/usr/bin/env bash
# Repeated bracket: Pagoda x2, vLLM x3 (one process), Pagoda x2, on prefill, mixed, chat.
set -eu
cd /work/main
M=/work/models/smollm2-135m-random; W=/work/run/r2/workloads; OUT=/work/run/rep
pagoda() { for r in 1 2; do for w in prefill mixed chat; do
  python -m shared.cli bench offline --model $M --workload $W/$w.json --max-num-batched-tokens 4096 --output $OUT/$1.jsonl >/dev/null 2>&1; done; done; }
pagoda pagoda_a
/work/venvs/vllm/bin/python bench/vllm_reference.py --model $M --dtype bfloat16 --max-num-batched-tokens 4096 \
  --workload $W/prefill.json $W/mixed.json $W/chat.json $W/prefill.json $W/mixed.json $W/chat.json $W/prefill.json $W/mixed.json $W/chat.json \
  --output $OUT/vllm.jsonl >/dev/null 2>&1
pagoda pagoda_b
echo done
