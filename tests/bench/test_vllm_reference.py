"""The vLLM server command the runner prints (--serve-args) and execs (--serve)."""

from __future__ import annotations

import argparse
import sys

from bench import vllm_reference

ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "MALLOC_MMAP_THRESHOLD_": "1",
    "MALLOC_TRIM_THRESHOLD_": "2",
    "MALLOC_TOP_PAD_": "3",
}


def _args(**overrides) -> argparse.Namespace:
    base = dict(model="/m", dtype="bfloat16", port=8322, enable_prefix_caching=True,
                enforce_eager=False, max_num_seqs=None, max_num_batched_tokens=None)  # fmt: skip
    return argparse.Namespace(**{**base, **overrides})


def test_server_invocation_keeps_the_server_defaults(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    env, cmd = vllm_reference.server_invocation(_args())
    assert env == ENV  # what the caller set wins over the runner's defaults
    assert cmd == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
                   "--dtype", "bfloat16", "--port", "8322", "--seed", "0",
                   "--enable-prompt-tokens-details"]  # fmt: skip
    _, eager = vllm_reference.server_invocation(_args(enforce_eager=True, max_num_seqs=8))
    assert eager[-3:] == ["--enforce-eager", "--max-num-seqs", "8"]


def test_serve_command_is_the_invocation_as_one_line(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    line = vllm_reference.serve_command(_args(enable_prefix_caching=False))
    assert line.startswith("VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=1 ")
    assert line.endswith("--enable-prompt-tokens-details --no-enable-prefix-caching")
