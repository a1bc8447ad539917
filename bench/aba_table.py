"""The ABA table: Pagoda before vLLM, vLLM, Pagoda after, per workload.

    python -m bench.aba_table BEFORE.jsonl VLLM.jsonl AFTER.jsonl > ABA.md

On a shared host the machine's speed drifts by 10-25% within minutes, so the
engines are compared within one bracket: vLLM against both Pagoda passes.
Only each file's offline lines with prefix caching on are read (the uncached
shared-prefix runs are a different experiment).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def throughputs(path: Path, engine_prefix: str) -> dict[str, float]:
    rates: dict[str, float] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if d.get("engine", "").startswith(engine_prefix) and d.get("prefix_caching", True):
            rates[d["workload"]] = d["total_tokens_per_s"]
    return rates


def main(argv: list[str]) -> None:
    before, vllm, after = (Path(a) for a in argv)
    a, v, b = throughputs(before, "pagoda"), throughputs(vllm, "vllm"), throughputs(after, "pagoda")
    print("| workload | pagoda (before) | vLLM CPU | pagoda (after) | ratio before | ratio after |")
    print("|---|---:|---:|---:|---:|---:|")
    for w in v:
        if w in a and w in b:
            print(
                f"| {w} | {a[w]:.1f} | {v[w]:.1f} | {b[w]:.1f} | "
                f"{a[w] / v[w]:.2f}x | {b[w] / v[w]:.2f}x |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
