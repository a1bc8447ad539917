"""CPU time per output token of every thread of a running `pagoda serve`, and of the client.

    python -m bench.serve_threads --server-pid PID [--output F] -- <pagoda bench serve args>

At one stream on a 2-core machine the worker's two OpenMP compute threads share
the cores with everything else that runs per token (the worker's event loop and
gRPC threads, the router, the client); wall time under other people's load says
little about who took the cores, CPU time does. This reads each thread's
/proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU, nanoseconds runnable but
waiting for one, timeslices) and its context-switch counts before and after one
`pagoda bench serve` run, and prints them per output token. The client's own CPU
time comes from getrusage of the child. Threads are named by role: a process's
main thread (tid == pid) is `main`; the others by their comm and, since Python
threads all show `python`, by rank of CPU time (the worker's engine thread and
its OpenMP thread are its two busiest).
"""

from __future__ import annotations

import argparse
import os
import resource

import psutil

from bench.jsonl import emit
from bench.serve_cpu import role, run_bench_serve


def _thread_stats(pid: int) -> dict[int, tuple[str, int, int, int, int, int]]:
    """tid -> (comm, run ns, wait ns, slices, voluntary, involuntary switches)."""
    stats = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return stats
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                run_ns, wait_ns, slices = (int(x) for x in f.read().split())
            with open(f"{base}/{tid}/comm") as f:
                comm = f.read().strip()
            voluntary = involuntary = 0
            with open(f"{base}/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        voluntary = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        involuntary = int(line.split()[1])
        except (OSError, ValueError):
            continue
        stats[int(tid)] = (comm, run_ns, wait_ns, slices, voluntary, involuntary)
    return stats


def snapshot(pid: int) -> dict[tuple[int, int], tuple]:
    """(pid, tid) -> (process role, comm, run ns, wait ns, slices, vol, invol)."""
    root = psutil.Process(pid)
    out = {}
    for proc in [root, *root.children(recursive=True)]:
        name = "router" if proc.pid == pid else role(proc)
        try:
            if "worker" in proc.cmdline()[3:4]:  # python -m shared.cli worker ...
                name = "worker"
        except psutil.Error:
            continue
        for tid, values in _thread_stats(proc.pid).items():
            out[(proc.pid, tid)] = (name, *values)
    return out


def per_token(before: dict, after: dict, tokens: int) -> list[dict]:
    """One row per thread that ran: microseconds per output token."""
    rows = []
    for key, (name, comm, run, wait, _slices, vol, invol) in after.items():
        old = before.get(key, (name, comm, 0, 0, 0, 0, 0))
        d_run, d_wait = run - old[2], wait - old[3]
        if d_run <= 0:
            continue
        rows.append(
            {
                "process": f"{name}[{key[0]}]",
                "thread": "main" if key[0] == key[1] else comm,
                "tid": key[1],
                "cpu_us_per_token": round(d_run / 1e3 / tokens, 1),
                "runqueue_wait_us_per_token": round(d_wait / 1e3 / tokens, 1),
                "switches_per_token": round((vol - old[5] + invol - old[6]) / tokens, 2),
                "involuntary_per_token": round((invol - old[6]) / tokens, 2),
            }
        )
    rows.sort(key=lambda r: (r["process"], -r["cpu_us_per_token"]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--output", help="Append the JSON line to this file.")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then bench serve args")
    args = parser.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    before = snapshot(args.server_pid)
    child_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()[0]
    summary = run_bench_serve(serve_args)
    after = snapshot(args.server_pid)
    child_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()[0]
    tokens = max(int(summary.get("total_output_tokens") or summary["output_tokens"]), 1)
    client_s = (child_after.ru_utime + child_after.ru_stime) - (
        child_before.ru_utime + child_before.ru_stime
    )
    threads = per_token(before, after, tokens)
    by_process: dict[str, float] = {}
    for row in threads:
        by_process[row["process"]] = by_process.get(row["process"], 0) + row["cpu_us_per_token"]
    record = {
        "kind": "serve_threads",
        "label": args.label,
        "output_tokens": tokens,
        "completed": summary["completed"],
        "tpot_p50_ms": summary["tpot_ms"]["p50"],
        "client_cpu_us_per_token": round(client_s * 1e6 / tokens, 1),
        "cpu_us_per_token_by_process": {k: round(v, 1) for k, v in by_process.items()},
        "threads": threads,
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
    }
    emit(record, args.output)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
