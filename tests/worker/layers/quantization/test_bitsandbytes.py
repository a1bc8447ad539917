"""NF4 through bitsandbytes: the library's matmul equals its dequantize-then-matmul
twin, and the weight bytes are a quarter of float16's plus the block absmaxes."""

from __future__ import annotations

import pytest
import torch

from worker.layers.linear import MergedColumnParallelLinear
from worker.layers.quantization import resolve_quantization
from worker.layers.quantization.bitsandbytes import apply_twin

pytest.importorskip("bitsandbytes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_4bit_matches_the_twin(dtype):
    quant = resolve_quantization(None, "bitsandbytes")
    layer = MergedColumnParallelLinear(128, [96, 96], quant_config=quant, params_dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    for shard in (0, 1):
        layer.weight_loader(
            layer.weight, (torch.randn(96, 128, generator=gen) * 0.1).to(dtype), shard
        )
    layer.process_weights_after_loading()
    assert not hasattr(layer, "weight")
    num_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert num_bytes == 192 * 128 // 2 + 192 * 128 // 64 * 4
    x = torch.randn(5, 128, generator=gen).to(dtype)
    got, twin = layer(x), apply_twin(layer, x, None)
    if dtype == torch.float32:
        torch.testing.assert_close(got, twin, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(got.float(), twin.float(), atol=0.05, rtol=0.02)


def test_prequantized_checkpoints_are_refused():
    from shared.errors import ConfigError

    with pytest.raises(
        ConfigError, match="pre-quantized bitsandbytes checkpoints are not supported"
    ):
        resolve_quantization({"quant_method": "bitsandbytes", "load_in_4bit": True}, None)
