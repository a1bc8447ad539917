"""Start-up errors of a tensor-parallel group say what to change."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from shared.errors import ConfigError
from worker import LLM

ENGINE = dict(block_size=4, max_model_len=64, num_kv_blocks=32)


def test_heads_that_do_not_split_name_the_sizes_that_work(make_checkpoint):
    path = make_checkpoint("llama")  # 4 heads, 2 KV heads
    with pytest.raises(ConfigError) as err:
        LLM(str(path), tensor_parallel_size=3, **ENGINE)
    assert str(err.value) == (
        "--tensor-parallel-size 3 does not fit LlamaForCausalLM: its 4 attention heads do not "
        "split into 3 equal parts; sizes that work: 1, 2, 4"
    )


def test_kv_heads_that_neither_split_nor_replicate(make_checkpoint):
    path = make_checkpoint(
        "llama", hidden_size=48, intermediate_size=96, num_attention_heads=6, num_key_value_heads=3
    )
    with pytest.raises(ConfigError) as err:
        LLM(str(path), tensor_parallel_size=2, **ENGINE)
    assert str(err.value) == (
        "--tensor-parallel-size 2 does not fit LlamaForCausalLM: its 3 KV heads neither split "
        "into 2 equal parts nor replicate evenly over 2 ranks; sizes that work: 1, 3, 6"
    )


def test_more_ranks_than_cores(make_checkpoint):
    path = make_checkpoint("llama")
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        with pytest.raises(ConfigError, match=r"needs 2 CPU cores on this node, one per rank"):
            LLM(str(path), tensor_parallel_size=2, device="cpu", **ENGINE)
    finally:
        os.sched_setaffinity(0, cores)


def test_a_rendezvous_that_times_out_names_the_address():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "from worker.distributed import init_tensor_parallel\n"
        f"init_tensor_parallel(1, 2, 'tcp://127.0.0.1:{port}', 'gloo')\n"
    )
    env = {**os.environ, "PAGODA_RENDEZVOUS_TIMEOUT": "2"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert f"rank 1 of 2 could not meet the others at 127.0.0.1:{port} within 2s" in done.stderr
