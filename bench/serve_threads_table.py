"""The table of bench/serve_threads_ab.sh: TPOT and CPU per token, pass by pass.

    python -m bench.serve_threads_table OUT/serve_threads.jsonl

Per pass: TPOT p50, CPU microseconds per output token of the worker's engine
thread (its busiest), its OpenMP thread (second busiest), the rest of the
worker, the router, the client, and the engine thread's run-queue wait; then
the new/old TPOT ratio of each adjacent old/new pair and their median.
"""

from __future__ import annotations

import json
import statistics
import sys


def columns(record: dict) -> dict[str, float]:
    worker = [t for t in record["threads"] if t["process"].startswith("worker")]
    worker.sort(key=lambda t: -t["cpu_us_per_token"])
    router = [t for t in record["threads"] if t not in worker]
    engine, omp = (worker + [{}, {}])[:2]
    return {
        "engine": engine.get("cpu_us_per_token", 0.0),
        "omp": omp.get("cpu_us_per_token", 0.0),
        "worker rest": sum(t["cpu_us_per_token"] for t in worker[2:]),
        "router": sum(t["cpu_us_per_token"] for t in router),
        "client": record["client_cpu_us_per_token"],
        "engine wait": engine.get("runqueue_wait_us_per_token", 0.0),
        "omp wait": omp.get("runqueue_wait_us_per_token", 0.0),
    }


def main() -> int:
    with open(sys.argv[1]) as f:
        rows = [json.loads(line) for line in f]
    names = list(columns(rows[0]))
    print(
        "| pass | label | TPOT p50 ms | " + " | ".join(f"{n} us/tok" for n in names) + " | load |"
    )
    print("|---|---|---:|" + "---:|" * len(names) + "---|")
    for i, row in enumerate(rows):
        values = columns(row)
        cells = " | ".join(f"{values[n]:.0f}" for n in names)
        print(
            f"| {i + 1} | {row['label']} | {row['tpot_p50_ms']:.2f} | {cells} | {row['loadavg_1m']} |"
        )
    ratios = []
    for first, second in zip(rows[::2], rows[1::2]):
        by = {first["label"]: first, second["label"]: second}
        if {"old", "new"} <= by.keys():
            ratios.append(by["new"]["tpot_p50_ms"] / by["old"]["tpot_p50_ms"])
    if ratios:
        shown = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"\nnew/old TPOT p50 per pair: {shown}; median {statistics.median(ratios):.3f}")
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [columns(r) for r in rows if r["label"] == label]
        medians = {n: statistics.median(m[n] for m in mine) for n in names}
        shown = ", ".join(f"{n} {v:.0f}" for n, v in medians.items())
        print(f"{label} medians (us/token): {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
