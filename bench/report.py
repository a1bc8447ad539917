"""`pagoda bench summary FILE.jsonl ...`: result lines -> markdown tables.

Offline results: one table per workload, one row per engine (and prefix-cache
setting), with total and output tokens/s, the ratios against the
`transformers` B=16 baseline and against vLLM when those ran on the same
workload, and the fraction of the roofline bound when a roofline line for the
workload is there. Where an engine ran a workload both with and without its
prefix cache, the cached / uncached time ratio follows the table. Serving
results: one table of latencies. Later lines for the same row replace earlier ones.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.jsonl import read_records
from bench.profile_table import profile_tables
from bench.targets import target_sections

BASELINE = "hf-static-B16"


def _kind(record: dict[str, Any]) -> str:
    # Lines without a kind (a reference runner's) are offline results.
    return record.get("kind", "offline" if "total_tokens_per_s" in record else "unknown")


def _label(record: dict[str, Any]) -> str:
    label = record["engine"]
    if record.get("prefix_caching") is False:
        label += " (no prefix cache)"
    return label


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _ratio(value: float, reference: dict[str, Any] | None) -> str:
    if reference is None:
        return "-"
    return f"{value / reference['total_tokens_per_s']:.2f}x"


def _latest(records: list[dict[str, Any]], key) -> dict[Any, dict[str, Any]]:
    latest: dict[Any, dict[str, Any]] = {}
    for record in records:
        latest[key(record)] = record
    return latest


def offline_tables(records: list[dict[str, Any]]) -> list[str]:
    offline = [r for r in records if _kind(r) == "offline"]
    bounds = {
        r["workload"]: r["bound_total_tokens_per_s"] for r in records if _kind(r) == "roofline"
    }
    lines: list[str] = []
    workloads = list(dict.fromkeys(r["workload"] for r in offline))
    for workload in workloads:
        rows = _latest([r for r in offline if r["workload"] == workload], _label)
        baseline = rows.get(BASELINE)
        vllm = next((r for label, r in rows.items() if label.startswith("vllm")), None)
        bound = bounds.get(workload, {})
        lines += [
            f"### {workload}",
            "",
            "| engine | dtype | total tok/s | output tok/s | vs hf B16 | vs vLLM "
            "| of fp32 bound | of bf16 bound | KV waste | prefix hits | elapsed s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, r in rows.items():
            total = r["total_tokens_per_s"]
            fractions = [
                _fmt(100 * total / bound[d], ".0f", "%") if d in bound else "-"
                for d in ("float32", "bfloat16")
            ]
            hits = r.get("prefix_cache_hit_rate")
            waste = r.get("kv_waste")
            lines.append(
                f"| {label} | {r.get('dtype', '-')} | {total:.1f} "
                f"| {r['output_tokens_per_s']:.1f} | {_ratio(total, baseline)} "
                f"| {_ratio(total, vllm)} | {fractions[0]} | {fractions[1]} "
                f"| {_fmt(None if waste is None else 100 * waste, '.1f', '%')} "
                f"| {_fmt(None if hits is None else 100 * hits, '.0f', '%')} "
                f"| {r['elapsed_s']:.2f} |"
            )
        lines += _cache_ratios(rows) + [""]
    return lines


def _cache_ratios(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Per engine with both runs: time with the prefix cache / time without it."""
    lines = []
    for uncached in rows.values():
        if uncached.get("prefix_caching") is not False:
            continue
        cached = rows.get(uncached["engine"])
        if cached is not None and cached.get("prefix_caching"):
            ratio = cached["elapsed_s"] / uncached["elapsed_s"]
            lines.append("")
            lines.append(
                f"{uncached['engine']}: cached / uncached time = {ratio:.2f} "
                f"({cached['elapsed_s']:.2f} s / {uncached['elapsed_s']:.2f} s)"
            )
    return lines


def serve_table(records: list[dict[str, Any]]) -> list[str]:
    serve = [r for r in records if _kind(r) == "serve"]
    if not serve:
        return []
    rows = _latest(
        serve,
        lambda r: (
            r["workload"],
            r["engine"],
            r["concurrency"],
            r["request_rate"],
            r.get("stream_interval"),
        ),
    )
    lines = [
        "### serving",
        "",
        "| workload | engine | load | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 ms "
        "| output tok/s | total tok/s | req/s | cached tokens | failed |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows.values():
        load = f"c={r['concurrency']}" if r["concurrency"] else f"rate={r['request_rate']}/s"
        if r.get("stream_interval"):
            load += f", stream_interval {r['stream_interval']}"
        ttft, tpot = r["ttft_ms"], r["tpot_ms"]
        lines.append(
            f"| {r['workload']} | {r['engine']} | {load} "
            f"| {_fmt(ttft['p50'])} / {_fmt(ttft['p99'])} "
            f"| {_fmt(tpot['p50'])} / {_fmt(tpot['p99'])} | {_fmt(r['itl_ms']['p50'])} "
            f"| {r['output_throughput']:.1f} | {r['total_token_throughput']:.1f} "
            f"| {r['request_throughput']:.2f} | {_fmt(r['cached_tokens'], 'd')} | {r['failed']} |"
        )
    return [*lines, ""]


def summarize_files(paths: list[str]) -> str:
    records = read_records(paths)
    # Load differs line to line, and so does software (a serve client imports no
    # torch, vLLM brings its own): the machine is its CPU and cores.
    machines = {
        tuple(r["machine"].get(k) for k in ("cpu", "cores")) for r in records if "machine" in r
    }
    lines = offline_tables(records) + serve_table(records) + target_sections(records)
    lines += profile_tables(records)
    if len(machines) > 1:
        lines.append(f"Note: these lines come from {len(machines)} different machines.")
    return "\n".join(lines).rstrip() + "\n"


def main(args: argparse.Namespace) -> int:
    print(summarize_files(args.files), end="")
    return 0
