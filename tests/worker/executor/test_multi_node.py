"""Two "nodes" on one machine over loopback: node 0 schedules and runs rank 0,
a headless `pagoda worker --node-rank 1` runs rank 1; same tokens as transformers."""

from __future__ import annotations

from shared.ports import free_port_run
from tests.cluster import PagodaProcess
from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.executor.step_relay import relay_port

GREEDY = SamplingParams(temperature=0, max_tokens=10)


def test_two_nodes_over_loopback_give_the_same_tokens(make_checkpoint, hf_greedy, tmp_path):
    path = make_checkpoint("llama")
    port = free_port_run(relay_port(0) + 1)  # the rendezvous port and the relay's
    group = ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", f"--master-port={port}"]
    node1 = PagodaProcess(
        "worker", ["--model", str(path), *group, "--node-rank", "1"], tmp_path / "node1.log"
    )
    try:
        llm = LLM(
            str(path),
            tensor_parallel_size=2,
            nnodes=2,
            node_rank=0,
            master_addr="127.0.0.1",
            master_port=port,
            block_size=4,
            max_model_len=128,
            num_kv_blocks=64,
        )
        prompts = random_prompts([3, 17, 40], seed=21)
        try:
            got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, detokenize=False)]
        finally:
            llm.shutdown()
        assert got == hf_greedy(path, prompts, 10)
        assert node1.process.wait(30) == 0, node1.log()  # node 0's shutdown stops it
    finally:
        node1.stop(timeout=5)
