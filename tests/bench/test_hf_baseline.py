"""The transformers static-batch baseline: only useful tokens count, padding is measured."""

from __future__ import annotations

import pytest

from bench.hf_baseline import load_model, run_hf_static
from bench.workloads import BenchRequest, Workload
from worker.config import EngineConfig


def test_static_batches_count_useful_tokens_and_padding_waste(make_checkpoint):
    path = str(make_checkpoint("llama"))
    model, dtype = load_model(EngineConfig.from_kwargs(model=path))
    lengths = [(3, 2), (5, 4), (4, 1), (6, 3), (2, 5)]  # (prompt, max_tokens)
    requests = tuple(
        BenchRequest(tuple(range(20 + i, 20 + i + p)), m) for i, (p, m) in enumerate(lengths)
    )
    result = run_hf_static(model, dtype, Workload("w", 0, 512, requests), 2, path)
    assert (result.engine, result.dtype, result.requests) == ("hf-static-B2", "float32", 5)
    assert (result.prompt_tokens, result.output_tokens) == (20, 15)
    # Batches (5 prompt + 4 new) x 2, (6 + 3) x 2, (2 + 5) x 1: 43 slots, 35 useful.
    assert result.padding_waste == pytest.approx(8 / 43)
    assert result.kv_waste is None and result.prefix_cache_hit_rate is None
    assert result.to_json()["output_tokens_per_s"] == round(15 / result.elapsed_s, 2)
