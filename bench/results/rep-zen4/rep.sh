#!/usr/bin/env bash
# Repeated bracket: Pagoda x2, vLLM x3 (one process), Pagoda x2, on all five workloads.
set -eu
cd /work/main
M=/work/models/smollm2-135m-random; W=/work/run/zen4/workloads; OUT=/work/run/rep4
WL=(mixed decode prefill shared-prefix chat)
pagoda() { for r in 1 2; do for w in "${WL[@]}"; do
  python -m shared.cli bench offline --model $M --workload $W/$w.json --max-num-batched-tokens 4096 --output $OUT/$1.jsonl >/dev/null 2>&1; done; done; }
pagoda pagoda_a
files=(); for r in 1 2 3; do for w in "${WL[@]}"; do files+=("$W/$w.json"); done; done
/work/venvs/vllm/bin/python bench/vllm_reference.py --model $M --dtype bfloat16 --max-num-batched-tokens 4096 \
  --workload "${files[@]}" --output $OUT/vllm.jsonl >/dev/null 2>&1
pagoda pagoda_b
echo done
