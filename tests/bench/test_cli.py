"""`pagoda bench` commands chained as docs/BENCHMARKS.md runs them (in this process:
the serve and summary tests run the entry point as a process)."""

from __future__ import annotations

import json

from bench.workloads import TokenDraw, Workload, mixed
from shared.cli import main

ENGINE = ["--max-model-len=128", "--block-size=4", "--num-kv-blocks=128"]


def test_offline_baseline_and_roofline_chain(make_checkpoint, tmp_path, capsys):
    def bench(*args: str) -> list[dict]:
        capsys.readouterr()
        assert main(["bench", *args]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    model = str(make_checkpoint("llama"))
    requests = mixed(TokenDraw(2, 512), num_requests=5, prompt_len=(4, 30), output_len=(2, 8))
    workload = tmp_path / "w.json"
    Workload("mixed-tiny", 2, 512, tuple(requests)).save(workload)
    results = str(tmp_path / "results.jsonl")
    common = ["--model", model, "--workload", str(workload), "--num-requests", "3"]

    (ours,) = bench("offline", *common, *ENGINE, "--output", results)
    baselines = bench("offline", *common, "--baseline", "hf-static", "--batch", "1", "2")
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests[:3])
    output_tokens = sum(r.max_tokens for r in requests[:3])
    for line in [ours, *baselines]:
        assert (line["workload"], line["requests"]) == ("mixed-tiny[:3]", 3)
        assert (line["prompt_tokens"], line["output_tokens"]) == (prompt_tokens, output_tokens)
    assert [b["engine"] for b in baselines] == ["hf-static-B1", "hf-static-B2"]
    assert baselines[0]["padding_waste"] == 0.0 < baselines[1]["padding_waste"]
    # The step budget's default depends on usage, so the line always records it.
    assert ours["flags"] == [
        "--max-model-len",
        "128",
        "--block-size",
        "4",
        "--num-kv-blocks",
        "128",
        "--max-num-batched-tokens",
        "4096",
    ]

    (roofline,) = bench("roofline", *common, "--result", results, "--matmul-size=64", "--repeats=1")
    assert roofline["kind"] == "roofline" and [r["engine"] for r in roofline["results"]] == [
        "pagoda"
    ]
    assert set(roofline["bound_total_tokens_per_s"]) == {"float32", "bfloat16"}
