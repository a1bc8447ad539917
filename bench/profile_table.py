"""The step profile's markdown table (bench/step_profile.py's `step_profile` lines).

One table per workload and clock (the last line of each), one row per
category, and per step kind (all steps, then mixed, decode, prefill
where the run had them) its mean ms per step and share of the step. Pure: used by
the profile command and by `pagoda bench summary`.
"""

from __future__ import annotations

from typing import Any

KINDS = ("all", "mixed", "decode", "prefill")


def profile_table(record: dict[str, Any]) -> list[str]:
    steps = record["steps"]
    kinds = [k for k in KINDS if k in steps]
    totals = {k: sum(steps[k]["ms_per_step"].values()) for k in kinds}
    categories = list(steps["all"]["ms_per_step"])
    machine = record.get("machine", {})
    lines = [
        f"### where a step's time goes: {record['workload']} "
        f"({record.get('dtype', '-')}, {_clock(record)}, "
        f"load average {machine.get('load_avg_1m', '-')})",
        "",
        "| category | "
        + " | ".join(f"{k} ({steps[k]['count']} steps) ms | %" for k in kinds)
        + " |",
        "|---|" + "---:|---:|" * len(kinds),
    ]
    for category in categories:
        cells = []
        for k in kinds:
            ms = steps[k]["ms_per_step"].get(category, 0.0)
            cells += [f"{ms:.2f}", f"{100 * ms / totals[k]:.1f}%" if totals[k] else "-"]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    lines.append("| **step** | " + " | ".join(f"**{totals[k]:.2f}** | 100%" for k in kinds) + " |")
    overhead = record.get("timer_overhead_ms_per_step")
    if overhead is not None:
        lines += [
            "",
            f"Timers: {record.get('timed_calls_per_step', 0):.0f} timed calls per step, "
            f"about {overhead:.2f} ms per step of their own overhead, inside the rows above.",
        ]
    if any("native loop off" in w for w in record.get("wrapped", [])):
        lines += [
            "",
            "Decode steps ran on the decode plan's Python loop so that each kernel could be "
            "timed; the engine runs them from one C++ call (worker/models/decode_stack.py), "
            'without most of "forward glue" and the calls\' own overhead.',
        ]
    return [*lines, ""]


def _clock(record: dict[str, Any]) -> str:
    if record.get("clock") == "thread":
        return "one thread, its CPU time"
    threads = record.get("cpu_threads") or record.get("machine", {}).get("threads")
    return f"wall time, {threads or '?'} threads"


def profile_tables(records: list[dict[str, Any]]) -> list[str]:
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == "step_profile":
            latest[(r["workload"], r.get("clock", "wall"))] = r
    return [line for r in latest.values() for line in profile_table(r)]
