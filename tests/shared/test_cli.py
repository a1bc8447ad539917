"""The `pagoda` entry point runs as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_generate_prints_json_and_logs_the_kv_budget(make_checkpoint):
    path = make_checkpoint("qwen2")
    result = run_cli(
        "generate",
        str(path),
        "--prompt",
        "Hello there",
        "--max-tokens",
        "5",
        "--max-model-len",
        "64",
        "--kv-cache-memory",
        "1MiB",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["prompt"] == "Hello there" and len(record["token_ids"]) <= 5
    assert "KV cache" in result.stderr and "blocks x 8 tokens" in result.stderr  # the CPU default


def test_bad_flag_value_fails_with_a_message(make_checkpoint):
    result = run_cli(
        "generate", str(make_checkpoint("qwen2")), "--prompt", "x", "--kv-cache-memory", "lots"
    )
    assert result.returncode == 2
    assert "not a memory size" in result.stderr


@pytest.mark.slow  # two rank processes; -tp parsing is checked by the next test
def test_generate_with_two_tensor_parallel_ranks_gives_the_same_tokens(make_checkpoint):
    from worker import LLM, SamplingParams

    path = make_checkpoint("qwen2")
    flags = ["--prompt", "Hello there", "--max-tokens", "6", "--max-model-len", "64", "--json"]
    result = run_cli("generate", str(path), "-tp", "2", "--num-kv-blocks", "32", *flags)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    llm = LLM(str(path), max_model_len=64, num_kv_blocks=32)
    (want,) = llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=6))
    assert record["token_ids"] == want.outputs[0].token_ids
    assert "x 2 ranks" in result.stderr


def test_a_tensor_parallel_size_that_does_not_fit_exits_2_naming_those_that_do(make_checkpoint):
    result = run_cli("generate", str(make_checkpoint("qwen2")), "--prompt", "x", "-tp", "3")
    assert result.returncode == 2
    assert "sizes that work: 1, 2, 4" in result.stderr
