"""The ABA table: Pagoda before vLLM, vLLM, Pagoda after, per workload.

    python -m bench.aba_table BEFORE.jsonl VLLM.jsonl AFTER.jsonl > ABA.md

On a shared host the machine's speed drifts by 10-25% within minutes, so the
engines are compared within one bracket: vLLM against both Pagoda passes.
Only each file's offline lines with prefix caching on are read (the uncached
shared-prefix runs are a different experiment). With one run of each workload
per file the table gives each pass's ratio; with repeated runs (bench/aba.sh
with PAGODA_REPEAT or VLLM_REPEAT) it lists every run and compares best with
best and median with median, Pagoda's two passes pooled.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def throughputs(path: Path, engine_prefix: str) -> dict[str, list[float]]:
    """Total tokens/s of every run, per workload, in file order."""
    rates: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if d.get("engine", "").startswith(engine_prefix) and d.get("prefix_caching", True):
            rates.setdefault(d["workload"], []).append(d["total_tokens_per_s"])
    return rates


def main(argv: list[str]) -> None:
    before, vllm, after = (Path(a) for a in argv)
    a, v, b = throughputs(before, "pagoda"), throughputs(vllm, "vllm"), throughputs(after, "pagoda")
    workloads = [w for w in v if w in a and w in b]
    if all(len(runs[w]) == 1 for runs in (a, v, b) for w in workloads):
        print(
            "| workload | pagoda (before) | vLLM CPU | pagoda (after) | ratio before | ratio after |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for w in workloads:
            (pa,), (pv,), (pb,) = a[w], v[w], b[w]
            print(f"| {w} | {pa:.1f} | {pv:.1f} | {pb:.1f} | {pa / pv:.2f}x | {pb / pv:.2f}x |")
        return
    print("| workload | Pagoda runs (tok/s) | vLLM runs (tok/s) | best / best | median / median |")
    print("|---|---|---|---:|---:|")
    for w in workloads:
        ours, theirs = a[w] + b[w], v[w]
        print(
            f"| {w} | {', '.join(f'{x:.0f}' for x in ours)} | "
            f"{', '.join(f'{x:.0f}' for x in theirs)} | {max(ours) / max(theirs):.2f}x | "
            f"{statistics.median(ours) / statistics.median(theirs):.2f}x |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
