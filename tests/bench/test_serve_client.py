"""The serving benchmark against a real `pagoda serve` of the tiny checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from bench.serve_client import LoadConfig, benchmark
from bench.workloads import TokenDraw, Workload, chat, mixed
from tests.cluster import ENGINE_FLAGS, REPO_ROOT, start_router, wait_serving

BLOCK_SIZE = 4  # ENGINE_FLAGS' --block-size


@pytest.fixture(scope="module")
def server(make_checkpoint, tmp_path_factory):
    args = [str(make_checkpoint("llama")), "--served-model-name=tiny", *ENGINE_FLAGS]
    router = start_router("serve", args, tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        wait_serving(router.process, router.base_url, 1)
        yield router.base_url
    finally:
        router.process.stop()


def test_cli_at_concurrency_2_counts_every_token(server, tmp_path):
    requests = mixed(TokenDraw(7, 512), num_requests=6, prompt_len=(4, 40), output_len=(2, 12))
    Workload("mixed-tiny", 7, 512, tuple(requests)).save(tmp_path / "w.json")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = ["bench", "serve", "--base-url", server, "--workload", str(tmp_path / "w.json")]
    argv += ["--concurrency", "2", "--engine", "pagoda-serve", "--output", str(tmp_path / "r")]
    done = subprocess.run(
        [sys.executable, "-m", "shared.cli", *argv], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line == json.loads((tmp_path / "r").read_text())
    assert (line["engine"], line["model"], line["kind"]) == ("pagoda-serve", "tiny", "serve")
    assert (line["completed"], line["failed"], line["first_error"]) == (6, 0, None)
    assert line["total_output_tokens"] == sum(r.max_tokens for r in requests)
    assert line["total_input_tokens"] == sum(len(r.prompt_token_ids) for r in requests)
    assert line["ttft_ms"]["p99"] <= line["e2el_ms"]["p99"]
    assert line["ttft_ms"]["mean"] <= line["e2el_ms"]["mean"]
    assert line["tpot_ms"]["p50"] > 0 and line["itl_ms"]["p50"] >= 0


def test_chat_turns_follow_each_other_and_hit_the_prefix_cache(server):
    requests, conversations = chat(
        TokenDraw(8, 512), num_conversations=2, num_turns=3, user_len=(8, 16), output_len=(4, 8)
    )
    workload = Workload("chat-tiny", 8, 512, tuple(requests), tuple(conversations))
    summary = asyncio.run(benchmark(server, workload, LoadConfig(concurrency=2)))
    assert (summary["completed"], summary["failed"]) == (6, 0)
    assert summary["total_output_tokens"] == sum(r.max_tokens for r in requests)
    # Each later turn finds the full blocks of the previous turn's prompt (the reply
    # tokens differ from what the model said, so nothing beyond them).
    expected = sum(
        len(requests[prev].prompt_token_ids) // BLOCK_SIZE * BLOCK_SIZE
        for conversation in conversations
        for prev in conversation[:-1]
    )
    assert summary["cached_tokens"] == expected


def test_poisson_arrivals_are_seeded_and_served(server):
    load = LoadConfig(request_rate=20.0, seed=3)
    assert load.arrival_times(4) == LoadConfig(request_rate=20.0, seed=3).arrival_times(4)
    assert load.arrival_times(4)[0] == 0.0
    requests = mixed(TokenDraw(9, 512), num_requests=4, prompt_len=(4, 20), output_len=(2, 6))
    summary = asyncio.run(benchmark(server, Workload("m", 9, 512, tuple(requests)), load, "tiny"))
    assert (summary["completed"], summary["failed"], summary["request_rate"]) == (4, 0, 20.0)
    assert summary["total_output_tokens"] == sum(r.max_tokens for r in requests)
