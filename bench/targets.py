"""The issue-22 targets, read off one run's result lines (bench/run_all.sh).

Three sections of `pagoda bench summary`, each empty when its lines are missing:

* serving, Pagoda against vLLM: total tokens/s and TTFT p50 at each concurrency
  both engines ran, a row per round where run_all.sh ran several (SERVE_ROUNDS:
  Pagoda then vLLM in each; the k-th line of each engine at a concurrency, in
  file order, make round k). A round's two servers ran minutes apart, so on a
  host whose speed drifts one round can mislead; the target rows take the
  median of the rounds' ratios.
* one stream (concurrency 1): decode speed (the median of the rounds' TPOT p50)
  as a fraction of the memory-bandwidth bound of the weights as each engine
  stores them,

      decode tok/s = 1000 / TPOT p50 (ms)
      bound tok/s  = read bandwidth (roofline) / weight bytes read per token

  (bench/weight_bytes.py: Pagoda's offline line measures its bytes; for vLLM,
  the roofline's weight count times the dtype it ran in).
* targets: one line each, measured value, goal, met or not.

The roofline lines give the bounds; the last one read wins (run_all.sh measures
the machine again at the end). The one-stream bound takes the median read of the
`read_probe` lines instead where there are any: run_all.sh takes one right
before each concurrency-1 served pass (a Zen 5's read moved 50-80 GB/s between
the run's first and last roofline, 23 minutes apart). Workload names cut by
`--num-requests` (`mixed[:6]`) count as their workload.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.weight_bytes import params_bytes

OFFLINE_RATIO = 1.5  # every offline workload, Pagoda / vLLM total tok/s
COMPUTE_FRACTION = 0.8  # mixed and prefill, of the fastest dtype's compute bound
COMPUTE_WORKLOADS = ("mixed", "prefill")
SERVE_RATIO = 1.3  # concurrency 16 and 64, total tok/s, with TTFT p50 no worse
SERVE_CONCURRENCY = (16, 64)
BANDWIDTH_FRACTION = 0.8  # concurrency 1, of the weights-as-stored bound
CACHE_RATIO = 0.17  # shared-prefix cached / uncached time (AVX2)


def base_name(workload: str) -> str:
    return workload.split("[", 1)[0]


def _is_vllm(engine: str) -> bool:
    return engine.startswith("vllm")


def _offline(records: list[dict]) -> dict[tuple[str, str, bool], dict]:
    """(workload, engine, prefix caching off) -> the last line."""
    rows = {}
    for r in records:
        if r.get("kind", "offline") == "offline" and "total_tokens_per_s" in r:
            key = (base_name(r["workload"]), r["engine"], r.get("prefix_caching") is False)
            rows[key] = r
    return rows


def _rooflines(records: list[dict]) -> dict[str, dict]:
    return {base_name(r["workload"]): r for r in records if r.get("kind") == "roofline"}


def _serve_lines(records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """(engine, concurrency) -> its `mixed` lines at a fixed concurrency, in file order.
    Where lines ask for several stream intervals (bench/serve_interval_ab.sh), only
    the smallest interval's count: a chunk per token unless every line asked more."""
    lines = [
        r
        for r in records
        if r.get("kind") == "serve" and r.get("concurrency") and base_name(r["workload"]) == "mixed"
    ]
    finest = min((r.get("stream_interval") or 1 for r in lines), default=1)
    rows: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in lines:
        if (r.get("stream_interval") or 1) == finest:
            rows[(r["engine"], r["concurrency"])].append(r)
    return rows


def serve_rounds(records: list[dict]) -> dict[int, list[tuple[dict, dict]]]:
    """concurrency -> [(Pagoda's line, vLLM's line)], one pair per round: the k-th
    line of each at that concurrency. Pagoda is the engine named `pagoda`, or else
    any engine that is not vLLM."""
    lines = _serve_lines(records)
    rounds = {}
    for c in sorted({c for _, c in lines}):
        found = {e: rs for (e, cc), rs in lines.items() if cc == c}
        theirs = [r for e, rs in found.items() if _is_vllm(e) for r in rs]
        ours = found.get("pagoda") or [r for e, rs in found.items() if not _is_vllm(e) for r in rs]
        if ours and theirs:
            rounds[c] = list(zip(ours, theirs))
    return rounds


def fastest_dtype(roofline: dict) -> str | None:
    """The dtype of the highest measured matmul peak (None without peaks)."""
    peaks = roofline.get("matmul_gflops")
    return max(peaks, key=peaks.get) if peaks else None


def _ratios(pair: tuple[dict, dict]) -> tuple[float, float]:
    """(total tok/s ratio, TTFT p50 ratio), Pagoda over vLLM."""
    ours, theirs = pair
    return (
        ours["total_token_throughput"] / theirs["total_token_throughput"],
        ours["ttft_ms"]["p50"] / theirs["ttft_ms"]["p50"],
    )


def serving_comparison(records: list[dict]) -> list[str]:
    lines = []
    for c, pairs in serve_rounds(records).items():
        for k, (ours, theirs) in enumerate(pairs):
            ratio, ttft = _ratios((ours, theirs))
            load = f"c={c}" if len(pairs) == 1 else f"c={c} round {k + 1}"
            lines.append(
                f"| {load} | {ours['total_token_throughput']:.1f} "
                f"| {theirs['total_token_throughput']:.1f} | {ratio:.2f}x "
                f"| {ours['ttft_ms']['p50']:.1f} | {theirs['ttft_ms']['p50']:.1f} | {ttft:.2f} |"
            )
    if not lines:
        return []
    return [
        "### serving, Pagoda vs vLLM (mixed)",
        "",
        "| load | pagoda total tok/s | vLLM total tok/s | ratio | pagoda TTFT p50 ms "
        "| vLLM TTFT p50 ms | TTFT ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *lines,
        "",
    ]


def _weight_bytes(engine: str, records: list[dict]) -> int | None:
    """The engine's weight bytes per decoded token, from its offline lines."""
    offline = _offline(records)
    lines = [r for (_, e, _), r in offline.items() if e == engine or e.startswith(engine)]
    for r in reversed(lines):
        if r.get("weight_bytes"):
            return r["weight_bytes"]
    rooflines = _rooflines(records)
    params = next(iter(rooflines.values()), {}).get("decode_weight_params")
    if params is None or not lines or lines[-1].get("dtype") is None:
        return None
    return params_bytes(params, lines[-1]["dtype"])


def single_stream(records: list[dict]) -> list[dict[str, Any]]:
    """Per engine served at concurrency 1: its decode rate against its bound."""
    probes = [r["memory_gb_s"]["read"] for r in records if r.get("kind") == "read_probe"]
    rooflines = [r for r in records if r.get("kind") == "roofline"]
    if probes:
        read_gb_s = statistics.median(probes)
    else:
        read_gb_s = rooflines[-1].get("memory_gb_s", {}).get("read") if rooflines else None
    rows = []
    for (engine, c), lines in _serve_lines(records).items():
        tpots = [r["tpot_ms"]["p50"] for r in lines if r["tpot_ms"]["p50"]]
        if c != 1 or not tpots:
            continue
        tpot = statistics.median(tpots)
        weight_bytes = _weight_bytes(engine, records)
        bound = read_gb_s * 1e9 / weight_bytes if read_gb_s and weight_bytes else None
        rate = 1000.0 / tpot
        rows.append(
            {
                "engine": engine,
                "tpot_ms": tpot,
                "tokens_per_s": rate,
                "weight_bytes": weight_bytes,
                "read_gb_s": read_gb_s,
                "bound_tokens_per_s": bound,
                "fraction": None if bound is None else rate / bound,
            }
        )
    return rows


def single_stream_table(records: list[dict]) -> list[str]:
    rows = single_stream(records)
    if not rows:
        return []
    lines = [
        "### one stream (c=1): decode against the bandwidth bound of the weights as stored",
        "",
        "| engine | TPOT p50 ms | decode tok/s | weight MB per token | read GB/s "
        "| bound tok/s | of bound |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mb = None if r["weight_bytes"] is None else r["weight_bytes"] / 1e6
        lines.append(
            f"| {r['engine']} | {r['tpot_ms']:.1f} | {r['tokens_per_s']:.1f} "
            f"| {_fmt(mb)} | {_fmt(r['read_gb_s'])} | {_fmt(r['bound_tokens_per_s'])} "
            f"| {_fmt(None if r['fraction'] is None else 100 * r['fraction'], '.0f', '%')} |"
        )
    return [*lines, ""]


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _row(name: str, measured: str, goal: str, met: bool) -> str:
    return f"| {name} | {measured} | {goal} | {'yes' if met else '**no**'} |"


def target_rows(records: list[dict]) -> list[str]:
    offline, rooflines, rounds = _offline(records), _rooflines(records), serve_rounds(records)
    rows = []
    for (workload, engine, uncached), ours in offline.items():
        if engine != "pagoda" or uncached:
            continue
        theirs = next(
            (r for (w, e, u), r in offline.items() if w == workload and _is_vllm(e) and not u),
            None,
        )
        if theirs is not None:
            ratio = ours["total_tokens_per_s"] / theirs["total_tokens_per_s"]
            rows.append(
                _row(f"{workload}: vs vLLM offline", f"{ratio:.2f}x", f">= {OFFLINE_RATIO}x",
                     ratio >= OFFLINE_RATIO)
            )  # fmt: skip
        dtype = fastest_dtype(rooflines[workload]) if workload in rooflines else None
        if workload in COMPUTE_WORKLOADS and dtype is not None:
            bound = rooflines[workload]["bound_total_tokens_per_s"][dtype]
            fraction = ours["total_tokens_per_s"] / bound
            rows.append(
                _row(f"{workload}: of the {dtype} compute bound", f"{100 * fraction:.0f}%",
                     f">= {100 * COMPUTE_FRACTION:.0f}%", fraction >= COMPUTE_FRACTION)
            )  # fmt: skip
    cached = offline.get(("shared-prefix", "pagoda", False))
    uncached = offline.get(("shared-prefix", "pagoda", True))
    if cached is not None and uncached is not None:
        ratio = cached["elapsed_s"] / uncached["elapsed_s"]
        rows.append(
            _row("shared-prefix: cached / uncached time", f"{ratio:.2f}",
                 f"<= {CACHE_RATIO} (AVX2)", ratio <= CACHE_RATIO)
        )  # fmt: skip
    for c in SERVE_CONCURRENCY:
        if c not in rounds:
            continue
        each = [_ratios(pair) for pair in rounds[c]]
        ratio = statistics.median(r for r, _ in each)
        ttft = statistics.median(t for _, t in each)
        measured = f"{ratio:.2f}x, TTFT {ttft:.2f}"
        if len(each) > 1:
            measured += " (median of rounds: " + ", ".join(f"{r:.2f}x" for r, _ in each) + ")"
        rows.append(
            _row(f"served c={c}: total tok/s vs vLLM, TTFT p50 ratio", measured,
                 f">= {SERVE_RATIO}x, TTFT <= 1", ratio >= SERVE_RATIO and ttft <= 1.0)
        )  # fmt: skip
    for r in single_stream(records):
        if r["engine"] == "pagoda" and r["fraction"] is not None:
            rows.append(
                _row("c=1 decode: of the weights' bandwidth bound", f"{100 * r['fraction']:.0f}%",
                     f">= {100 * BANDWIDTH_FRACTION:.0f}%", r["fraction"] >= BANDWIDTH_FRACTION)
            )  # fmt: skip
    if not rows:
        return []
    return ["### targets (issue 22)", "", "| target | measured | goal | met |",
            "|---|---|---|---|", *rows, ""]  # fmt: skip


def target_sections(records: list[dict]) -> list[str]:
    return serving_comparison(records) + single_stream_table(records) + target_rows(records)
