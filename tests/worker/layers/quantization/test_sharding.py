"""Quantized layers shard like dense ones: each rank's shard, built from the same
checkpoint tensors through the layers' weight_loader, computes its slice (column
parallel) or its partial sum (row parallel) of the unsharded layer's output."""

from __future__ import annotations

import pytest
import torch

from bench.quantized_checkpoints import (
    quantize_awq,
    quantize_compressed_int,
    quantize_fp8,
    quantize_gptq,
)
from worker import distributed
from worker.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from worker.layers.quantization import resolve_quantization

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTER = 128, 16, 8, 4, 256
GPTQ_ACT_ORDER = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
FP8_BLOCK = {"quant_method": "fp8", "weight_block_size": [16, 32]}
FP8_TENSOR = {"quant_method": "fp8", "activation_scheme": "static"}
CT_INT4_ASYM = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "g": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                        "group_size": 32},
        }
    },
}  # fmt: skip


def _quantize(config, weight, seed):
    method = config["quant_method"]
    if method == "gptq":
        return quantize_gptq(weight, 4, 32, desc_act=True, sym=False, seed=seed)[0]
    if method == "fp8":
        return quantize_fp8(
            weight, config.get("weight_block_size"), static="activation_scheme" in config
        )[0]
    if method == "compressed-tensors":
        return quantize_compressed_int(weight, 4, 32, sym=False)[0]
    return quantize_awq(weight, 32)[0]


def _build(make, rank, tp_size, parts, monkeypatch):
    """A layer at (rank, tp_size), each checkpoint part loaded through its loader."""
    monkeypatch.setattr(distributed, "_TP_RANK", rank)
    monkeypatch.setattr(distributed, "_TP_SIZE", tp_size)
    layer = make()
    params = dict(layer.named_parameters())
    for shard_id, tensors in parts:
        for name, tensor in tensors.items():
            params[name].weight_loader(params[name], tensor.to(params[name].dtype), shard_id)
    layer.process_weights_after_loading()
    return layer


@pytest.mark.parametrize(
    "config",
    [GPTQ_ACT_ORDER, AWQ, FP8_BLOCK, FP8_TENSOR, CT_INT4_ASYM],
    ids=["gptq-act-order", "awq", "fp8-block", "fp8-tensor", "ct-int4-asym"],
)
def test_column_and_row_shards_equal_the_whole(config, monkeypatch):
    quant = resolve_quantization(config, None)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, HIDDEN, generator=gen)
    x_inter = torch.randn(5, INTER, generator=gen)
    qkv_parts = [
        (sid, _quantize(config, torch.randn(n * HEAD_DIM, HIDDEN, generator=gen) * 0.1, 7))
        for sid, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))
    ]
    gate_up_parts = [
        (i, _quantize(config, torch.randn(INTER, HIDDEN, generator=gen) * 0.1, 8)) for i in (0, 1)
    ]
    down = [(None, _quantize(config, torch.randn(HIDDEN, INTER, generator=gen) * 0.1, 9))]

    def qkv():
        return QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, quant_config=quant)

    def gate_up():
        return MergedColumnParallelLinear(HIDDEN, [INTER, INTER], quant_config=quant)

    def down_proj():
        return RowParallelLinear(INTER, HIDDEN, reduce_results=False, quant_config=quant)

    whole_qkv = _build(qkv, 0, 1, qkv_parts, monkeypatch)(x)
    whole_gate_up = _build(gate_up, 0, 1, gate_up_parts, monkeypatch)(x)
    whole_down = _build(down_proj, 0, 1, down, monkeypatch)(x_inter)
    shards = [_build(qkv, r, 2, qkv_parts, monkeypatch)(x) for r in range(2)]
    q, k, v = (HEADS // 2 * HEAD_DIM, KV_HEADS // 2 * HEAD_DIM, KV_HEADS // 2 * HEAD_DIM)
    split = [s.split([q, k, v], dim=-1) for s in shards]
    joined = torch.cat([torch.cat([p[i] for p in split], dim=-1) for i in range(3)], dim=-1)
    torch.testing.assert_close(joined, whole_qkv, atol=1e-5, rtol=1e-5)
    shards = [_build(gate_up, r, 2, gate_up_parts, monkeypatch)(x) for r in range(2)]
    gates = torch.cat([s[:, : INTER // 2] for s in shards], dim=-1)
    ups = torch.cat([s[:, INTER // 2 :] for s in shards], dim=-1)
    torch.testing.assert_close(torch.cat([gates, ups], -1), whole_gate_up, atol=1e-5, rtol=1e-5)
    halves = x_inter.chunk(2, dim=-1)  # each rank holds its slice of the inputs
    partial = [_build(down_proj, r, 2, down, monkeypatch)(halves[r]) for r in range(2)]
    torch.testing.assert_close(partial[0] + partial[1], whole_down, atol=1e-5, rtol=1e-5)
