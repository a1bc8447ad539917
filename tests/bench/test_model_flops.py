"""FLOP counts against hand computations."""

from __future__ import annotations

from types import SimpleNamespace

from bench.model_flops import ModelFlops
from bench.workloads import BenchRequest, Workload
from worker.models.spec import ModelSpec


def tiny_spec(**overrides):
    fields = dict(
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=512,
        sliding_windows=(None, None),
    )
    return SimpleNamespace(**{**fields, **overrides})


def test_counts_of_the_tiny_checkpoint_read_from_its_folder(make_checkpoint):
    flops = ModelFlops.from_spec(ModelSpec.from_folder(make_checkpoint("llama")))
    assert flops == ModelFlops.from_spec(tiny_spec())
    # Per layer: q, o 64x64 each; k, v 64x32 each; gate, up, down 64x128 each.
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert flops.linear_flops_per_token == 2 * 2 * per_layer == 147_456
    assert flops.lm_head_flops_per_token == 2 * 64 * 512
    assert flops.attention_flops_per_key == (4 * 4 * 16, 4 * 4 * 16)


def test_request_flops_by_hand():
    flops = ModelFlops.from_spec(tiny_spec())
    # 5 prompt + 3 output tokens: 7 computed (positions 0-6), logits for 3 of them,
    # attention over 1 + 2 + ... + 7 = 28 keys in each of 2 layers.
    expected = 7 * 147_456 + 3 * 65_536 + 2 * 256 * 28
    assert flops.request_flops(5, 3) == expected == 1_243_136
    workload = Workload("w", 0, 512, (BenchRequest((20,) * 5, 3), BenchRequest((20,) * 2, 1)))
    # The second: 2 computed tokens, 1 logit row, 1 + 2 keys per layer.
    assert flops.workload_flops(workload) == expected + 2 * 147_456 + 65_536 + 2 * 256 * 3


def test_sliding_window_caps_the_context():
    flops = ModelFlops.from_spec(tiny_spec(sliding_windows=(4, None)))
    full = ModelFlops.from_spec(tiny_spec())
    # Layer 0 sees at most 4 keys: 1 + 2 + 3 + 4 + 4 + 4 + 4 = 22 instead of 28.
    assert full.request_flops(5, 3) - flops.request_flops(5, 3) == 256 * (28 - 22)
