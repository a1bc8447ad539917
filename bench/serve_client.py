"""`pagoda bench serve`: drive any OpenAI-compatible server with a workload.

Every request is a streaming `POST /v1/completions` with the prompt as token ids
(our router and vLLM both take a list of ints), `max_tokens`, `ignore_eos`,
greedy, and the usage chunk asked for. Load is either a fixed number of requests
in flight (`--concurrency`) or Poisson arrivals at `--request-rate` per second,
seeded, as `vllm bench serve` draws them. A chat turn is sent only once the
previous turn of its conversation has ended, as a client would. Metrics:
bench/serve_metrics.py.

The client is aiohttp, as `vllm bench serve`'s is: on the 2-core machines the
server runs on, the client's CPU comes out of the server's. On a Zen 5, one
server, the two clients alternated: httpx took 0.35-0.39 ms of CPU per streamed
token, aiohttp 0.18-0.20; `mixed` at concurrency 64 (prefix caching off), 4
rounds, the server's total tok/s with aiohttp 1.03-1.05x (bench/results/
zen5-e9a366d/client-ab/); at 1 and 16 within the host's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass

import aiohttp

from bench.jsonl import emit
from bench.machine import describe_machine
from bench.serve_metrics import RequestRecord, summarize
from bench.workloads import DEFAULT_VOCAB_SIZE, BenchRequest, Workload, resolve_workloads


@dataclass(frozen=True)
class LoadConfig:
    concurrency: int | None = None  # requests in flight; None = no limit
    request_rate: float | None = None  # Poisson arrivals per second; None = all at once
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("give exactly one of concurrency and request_rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError(f"request_rate must be > 0, got {self.request_rate}")

    def arrival_times(self, num_requests: int) -> list[float]:
        """Seconds after the start at which each request may be sent."""
        if self.request_rate is None:
            return [0.0] * num_requests
        rng = random.Random(self.seed)
        times, now = [], 0.0
        for _ in range(num_requests):
            times.append(now)
            now += rng.expovariate(self.request_rate)
        return times


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    request: BenchRequest,
    stream_interval: int | None = None,
) -> RequestRecord:
    """One streaming completion, timed as `vllm bench serve` times it. stream_interval:
    the request's (vLLM's field; Pagoda's too), tokens per streamed chunk."""
    record = RequestRecord(len(request.prompt_token_ids), request.max_tokens)
    body = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": request.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if stream_interval is not None:
        body["stream_interval"] = stream_interval
    num_chunks = 0
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                text = (await response.read()).decode(errors="replace")
                record.error = f"HTTP {response.status}: {text[:500]}"
                return record
            async for raw in response.content:  # one SSE line at a time, "\n" included
                line = raw.decode()
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                data = json.loads(payload)
                if "error" in data:  # a stream that fails after it started
                    record.error = json.dumps(data["error"])[:500]
                    return record
                if data.get("choices"):
                    now = time.perf_counter()
                    if num_chunks == 0:
                        record.ttft = now - start
                    else:
                        record.itl.append(now - last)
                    last, num_chunks = now, num_chunks + 1
                elif usage := data.get("usage"):
                    record.output_tokens = usage.get("completion_tokens") or 0
                    record.prompt_len = usage.get("prompt_tokens") or record.prompt_len
                    details = usage.get("prompt_tokens_details") or {}
                    record.cached_tokens = details.get("cached_tokens")
    # ValueError: a chunk that is not JSON, or a line longer than read_bufsize.
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    if num_chunks == 0:
        record.error = "the stream carried no choice chunk"
        return record
    record.success = True
    record.latency = last - start
    if not record.output_tokens:  # no usage chunk: the chunks are the best count there is
        record.output_tokens = num_chunks
    return record


def _predecessors(workload: Workload) -> list[int | None]:
    """Per request, the request that must end before it is sent (its previous turn)."""
    before: list[int | None] = [None] * len(workload.requests)
    for conversation in workload.conversations or ():
        for prev, cur in itertools.pairwise(conversation):
            before[cur] = prev
    return before


async def run_load(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    workload: Workload,
    load: LoadConfig,
    stream_interval: int | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every request of `workload`; returns their records and the duration."""
    arrivals = load.arrival_times(len(workload.requests))
    before = _predecessors(workload)
    ended = [asyncio.Event() for _ in workload.requests]
    slots = asyncio.Semaphore(load.concurrency or len(workload.requests))
    records: list[RequestRecord | None] = [None] * len(workload.requests)
    start = time.perf_counter()

    async def one(i: int) -> None:
        try:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            if before[i] is not None:
                await ended[before[i]].wait()
            async with slots:
                records[i] = await send_request(
                    session, url, model, workload.requests[i], stream_interval
                )
        finally:
            ended[i].set()

    await asyncio.gather(*(one(i) for i in range(len(workload.requests))))
    return records, time.perf_counter() - start


async def first_model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as response:
        response.raise_for_status()
        return (await response.json())["data"][0]["id"]


async def benchmark(
    base_url: str,
    workload: Workload,
    load: LoadConfig,
    model: str | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
    stream_interval: int | None = None,
) -> dict:
    """Run `workload` against the server at `base_url`; the summary as a dict."""
    base_url = base_url.rstrip("/").removesuffix("/v1")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    # No pool limit (it would queue requests in the client and add to TTFT), and no
    # proxies from the environment: the server is usually on this machine.
    async with aiohttp.ClientSession(
        headers=headers,
        # Per connect and per read, as httpx's timeout was: a long stream is no error.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout),
        connector=aiohttp.TCPConnector(limit=0),
        trust_env=False,
        read_bufsize=1 << 20,  # the longest SSE line it reads whole (logprobs make long ones)
    ) as session:
        model = model or await first_model(session, base_url)
        url = f"{base_url}/v1/completions"
        records, duration = await run_load(session, url, model, workload, load, stream_interval)
    return {
        "kind": "serve",
        "base_url": base_url,
        "model": model,
        "workload": workload.name,
        "seed": workload.seed,
        "requests": len(workload.requests),
        "concurrency": load.concurrency,
        "request_rate": load.request_rate,
        "stream_interval": stream_interval,
        **summarize(records, duration),
    }


def main(args: argparse.Namespace) -> int:
    vocab_size = args.vocab_size or DEFAULT_VOCAB_SIZE
    workloads = resolve_workloads(args.workload, args.seed, vocab_size, args.num_requests)
    if len(workloads) != 1:
        raise SystemExit("pagoda bench serve runs one workload at a time")
    workload = workloads[0]
    load = LoadConfig(args.concurrency, args.request_rate, args.seed)
    summary = asyncio.run(
        benchmark(
            args.base_url,
            workload,
            load,
            args.model,
            args.api_key,
            args.timeout,
            args.stream_interval,
        )
    )
    record = {"engine": args.engine or "server", **summary}
    emit({**record, "machine": describe_machine(with_torch=False)}, args.output)
    return 0 if summary["failed"] == 0 else 1
