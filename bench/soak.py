"""Soak: `pagoda serve --num-workers 2` under steady mixed traffic for a long time.

    python -m bench.soak --duration 1800 --concurrency 64 [--model PATH] [--out soak.json]

Each of `--concurrency` clients sends requests back to back, in turn streamed,
whole, and streamed but cancelled after its first chunks. Every `--sample-every`
seconds the router's and each worker's RSS and every worker's KV blocks are read;
at the end the traffic stops and the KV pools must be back where they started.
What must hold: no failure, RSS flat (start / middle / end reported; "flat": each
process grew less than 5% from the middle sample to the last; the growth is also
given in bytes per request completed meanwhile), KV pools back to
their start, p99 latency of the last window within 20% of the first window's (a
window is `--window` seconds, default 5 minutes or a sixth of shorter runs). Every
window's p99 and the load average at each sample are reported beside the rule:
on a machine shared with other work the first window's p99 says more about the
neighbours than about the server, so judge the rule on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import httpx
import psutil

from shared.ports import free_port_run
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as wpb_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "soak"
ENGINE_FLAGS = ["--max-model-len=512", "--num-kv-blocks=1024", "--cpu-threads=1"]
KINDS = ("streamed", "whole", "cancelled")


@dataclass
class Sample:
    at_s: float
    router_rss_mb: float
    worker_rss_mb: list[float]
    kv_blocks_used: list[int]
    kv_blocks_cached: list[int]
    requests_done: int
    load_average: float = 0.0  # 1-minute, of the whole machine


@dataclass
class Window:
    start_s: float
    end_s: float
    requests: int
    p99_s: float


RSS_FLAT = 0.05  # the most a process may grow from the middle sample to the last
P99_RULE = 1.2  # the last window's p99 may be at most this times the first's


@dataclass
class SoakResult:
    duration_s: float
    concurrency: int
    requests: dict[str, int] = field(default_factory=dict)  # kind -> completed
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    kv_start: list[int] = field(default_factory=list)
    kv_end: list[int] = field(default_factory=list)
    p99_first_s: float = 0.0
    p99_last_s: float = 0.0
    windows: list[Window] = field(default_factory=list)

    def rss_growth(self) -> dict[str, float]:
        """Per process, its RSS growth from the middle sample to the last, as a fraction."""
        if len(self.samples) < 3:
            return {}
        middle, last = self.samples[len(self.samples) // 2], self.samples[-1]
        growth = {"router": last.router_rss_mb / middle.router_rss_mb - 1}
        for i, (a, b) in enumerate(zip(middle.worker_rss_mb, last.worker_rss_mb)):
            growth[f"worker {i}"] = b / a - 1
        return {k: round(v, 4) for k, v in growth.items()}

    def rss_bytes_per_request(self) -> dict[str, float]:
        """Per process, its RSS growth from the middle sample to the last, in bytes per
        request completed between them (a leak's size; the middle skips the warm-up)."""
        if len(self.samples) < 3:
            return {}
        middle, last = self.samples[len(self.samples) // 2], self.samples[-1]
        num_requests = last.requests_done - middle.requests_done
        if num_requests <= 0:
            return {}
        pairs = {"router": (middle.router_rss_mb, last.router_rss_mb)}
        for i, pair in enumerate(zip(middle.worker_rss_mb, last.worker_rss_mb)):
            pairs[f"worker {i}"] = pair
        return {k: round((b - a) * 2**20 / num_requests, 1) for k, (a, b) in pairs.items()}

    def verdict(self) -> list[str]:
        """What did not hold (empty: the soak passed)."""
        problems = [f"{len(self.failures)} failures, e.g. {self.failures[:3]}"] * bool(
            self.failures
        )
        if self.kv_end != self.kv_start:
            problems.append(
                f"KV blocks in use {self.kv_start} at the start, {self.kv_end} at the end"
            )
        grown = {k: g for k, g in self.rss_growth().items() if g > RSS_FLAT}
        if grown:
            problems.append(f"RSS not flat (growth from the middle to the end): {grown}")
        if self.p99_first_s and self.p99_last_s > P99_RULE * self.p99_first_s:
            problems.append(f"p99 {self.p99_first_s:.3f} s first, {self.p99_last_s:.3f} s last")
        return problems


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)] if ordered else 0.0


class Soak:
    def __init__(self, base_url: str, api_key: str, concurrency: int, max_tokens: int) -> None:
        self.base_url, self.concurrency, self.max_tokens = base_url, concurrency, max_tokens
        self.headers = {"authorization": f"Bearer {api_key}"}
        self.latencies: list[tuple[float, float]] = []  # (end time, seconds)
        self.done: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.failures: list[str] = []

    async def one(self, client: httpx.AsyncClient, i: int) -> None:
        kind = KINDS[i % len(KINDS)]
        body = {
            "model": MODEL_NAME,
            "prompt": f"soak request {i % 50} " * (1 + i % 7),
            "max_tokens": self.max_tokens,
            "temperature": 0 if i % 2 else 0.8,
            "stream": kind != "whole",
        }
        started = time.monotonic()
        try:
            if kind == "whole":
                response = await client.post("/v1/completions", json=body)
                if (
                    response.status_code != 200
                    or not response.json()["choices"][0]["finish_reason"]
                ):
                    raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
            else:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        raise RuntimeError(
                            f"{response.status_code}: {(await response.aread())[:200]}"
                        )
                    finish, num_chunks = None, 0
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[6:])
                        if "error" in event:
                            raise RuntimeError(event["error"]["message"])
                        num_chunks += 1
                        finish = event["choices"][0]["finish_reason"] or finish
                        if kind == "cancelled" and num_chunks >= 3:
                            break
                    if kind == "streamed" and finish is None:
                        raise RuntimeError("the stream ended without a finish reason")
        except Exception as exc:  # every failure is reported, none stops the soak
            self.failures.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        now = time.monotonic()
        self.done[kind] += 1
        if kind != "cancelled":
            self.latencies.append((now, now - started))

    async def client_loop(self, index: int, until: float) -> None:
        async with httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=120
        ) as client:
            i = index
            while time.monotonic() < until:
                await self.one(client, i)
                i += self.concurrency


def worker_loads(ports: list[int]) -> list[wpb.GetLoadResponse]:
    loads = []
    for port in ports:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)
            loads.append(stub.GetLoad(wpb.GetLoadRequest(), timeout=30))
    return loads


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def start_serve(model: Path, log: Path, port: int) -> tuple[subprocess.Popen, list[int], list[int]]:
    """`pagoda serve` with two workers; its process, the workers' pids and ports."""
    # The repo first; a PYTHONPATH given to the soak stays after it (a sitecustomize probe).
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("REDIS_URL", None)
    command = [sys.executable, "-m", "shared.cli", "serve", str(model), "--num-workers=2"]
    command += [f"--served-model-name={MODEL_NAME}", "--api-key=soak", "--host=127.0.0.1"]
    command += [f"--port={port}", "--grpc-port=0", *ENGINE_FLAGS]
    process = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"pagoda serve exited:\n{log.read_text()[-3000:]}")
        try:
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
            if health.get("workers_serving") == 2:
                started = re.findall(
                    r"started worker \d+ \(pid (\d+)\) on port (\d+)", log.read_text()
                )
                return process, [int(p) for p, _ in started], [int(q) for _, q in started]
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("pagoda serve did not start in 300 s")


async def soak(
    args: argparse.Namespace, base_url: str, pids: list[int], ports: list[int], router_pid: int
) -> SoakResult:
    result = SoakResult(args.duration, args.concurrency)
    result.kv_start = [load.num_kv_blocks_used for load in worker_loads(ports)]
    runner = Soak(base_url, "soak", args.concurrency, args.max_tokens)
    started = time.monotonic()
    until = started + args.duration
    clients = [asyncio.create_task(runner.client_loop(i, until)) for i in range(args.concurrency)]

    def sample() -> None:
        loads = worker_loads(ports)
        result.samples.append(
            Sample(
                round(time.monotonic() - started, 1),
                round(rss_mb(router_pid), 1),
                [round(rss_mb(pid), 1) for pid in pids],
                [load.num_kv_blocks_used for load in loads],
                [load.num_kv_blocks_cached for load in loads],
                sum(runner.done.values()),
                round(os.getloadavg()[0], 1),
            )
        )
        print(json.dumps(asdict(result.samples[-1])), flush=True)

    while time.monotonic() < until:
        await asyncio.sleep(min(args.sample_every, max(until - time.monotonic(), 0)))
        await asyncio.to_thread(sample)
    await asyncio.gather(*clients)
    await asyncio.sleep(2.0)  # cancelled streams' aborts reach the engines
    result.kv_end = [
        load.num_kv_blocks_used for load in await asyncio.to_thread(worker_loads, ports)
    ]
    await asyncio.to_thread(sample)
    window = args.window or min(300.0, args.duration / 6)
    result.p99_first_s = p99([s for t, s in runner.latencies if t - started < window])
    result.p99_last_s = p99([s for t, s in runner.latencies if until - t < window])
    edges = [started + i * window for i in range(int(args.duration // window) + 1)]
    for a, b in zip(edges, edges[1:] + [until] * (edges[-1] < until)):
        inside = [s for t, s in runner.latencies if a <= t < b]
        result.windows.append(Window(round(a - started), round(b - started), len(inside),
                                     round(p99(inside), 3)))  # fmt: skip
    result.requests, result.failures = runner.done, runner.failures
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="Seconds of traffic.")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--sample-every", type=float, default=60.0)
    parser.add_argument(
        "--window", type=float, help="Seconds per p99 window (default: 300, or duration / 6)."
    )
    parser.add_argument("--model", type=Path, help="Checkpoint (default: a tiny random llama).")
    parser.add_argument("--out", type=Path, help="Write the result here as JSON.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from bench.checkpoints import build_random_checkpoint

            model = build_random_checkpoint(Path(tmp) / "tiny", "llama")
        port = free_port_run()
        process, pids, ports = start_serve(model, Path(tmp) / "serve.log", port)
        try:
            result = asyncio.run(soak(args, f"http://127.0.0.1:{port}", pids, ports, process.pid))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    summary = asdict(result)
    summary["verdict"] = result.verdict() or "ok"
    summary["rss_growth_middle_to_end"] = result.rss_growth()
    summary["rss_bytes_per_request_middle_to_end"] = result.rss_bytes_per_request()
    first, last = result.p99_first_s, result.p99_last_s
    summary["p99_rule"] = {
        "first_s": first, "last_s": last, "ratio": round(last / first, 3) if first else None,
        "holds": bool(first) and last <= P99_RULE * first,
        "load_average_first_last": [result.samples[0].load_average,
                                    result.samples[-1].load_average] if result.samples else [],
    }  # fmt: skip
    print(json.dumps({k: summary[k] for k in summary if k != "samples"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0 if not result.verdict() else 1


if __name__ == "__main__":
    sys.exit(main())
