"""CPU seconds per completed request of a running `pagoda serve` (or any server).

    python -m bench.serve_cpu --server-pid PID [--output F] -- <pagoda bench serve args>

Wall-clock tok/s means little on a shared machine; the CPU time the serving
processes spend per request does not depend on who else runs. This snapshots
user + system CPU time of the server process and all its descendants (router,
workers, an engine core), runs `pagoda bench serve` with the given arguments
(the client's own CPU is not counted), snapshots again, and divides each
process's CPU time by the number of completed requests. Run a warm-up pass
first: the first requests pay for one-time work (kernel loads, allocator growth).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import psutil

from bench.jsonl import emit


def role(proc: psutil.Process) -> str:
    """A short name for what the process is: the `-m` module, else its name."""
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return "gone"
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]
    return proc.name()


def cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU s) for `pid` and every descendant alive now."""
    root = psutil.Process(pid)
    seconds = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            seconds[proc.pid] = (role(proc), times.user + times.system)
        except psutil.Error:
            continue
    return seconds


def run_bench_serve(serve_args: list[str]) -> dict:
    """Run `pagoda bench serve *serve_args` to its end; its summary line."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "serve.jsonl")
        command = [sys.executable, "-m", "shared.cli", "bench", "serve", *serve_args]
        subprocess.run([*command, "--output", result_path], check=False, stdout=subprocess.DEVNULL)
        with open(result_path) as f:
            return json.loads(f.readlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--output", help="Append the JSON line to this file.")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then bench serve args")
    args = parser.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    before = cpu_seconds(args.server_pid)
    load_before = os.getloadavg()
    summary = run_bench_serve(serve_args)
    after = cpu_seconds(args.server_pid)
    load_after = os.getloadavg()
    completed = max(summary["completed"], 1)
    per_process = {}
    for pid, (name, seconds) in after.items():
        used = seconds - before.get(pid, (name, 0.0))[1]
        key = f"{name}[{pid}]"
        per_process[key] = round(used / completed, 5)
    record = {
        "kind": "serve_cpu",
        "concurrency": summary.get("concurrency"),
        "completed": summary["completed"],
        "failed": summary["failed"],
        "cpu_s_per_request": round(sum(per_process.values()), 5),
        "cpu_s_per_request_by_process": per_process,
        "total_tok_s": summary.get("total_token_throughput"),
        "ttft_p50_ms": summary.get("ttft_ms", {}).get("p50")
        if isinstance(summary.get("ttft_ms"), dict)
        else summary.get("ttft_p50_ms"),
        "loadavg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
    }
    emit(record, args.output)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
