"""Which format a checkpoint and --quantization select, and the start-up errors
for formats the engine cannot serve (each names what to fix)."""

from __future__ import annotations

import json

import pytest

from shared.errors import ConfigError
from worker import LLM
from worker.layers.quantization import resolve_quantization, supported_quantizations
from worker.layers.quantization.base import is_layer_skipped
from worker.layers.quantization.gptq import GPTQConfig
from worker.layers.quantization.online import Int4Config

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def test_the_checkpoint_format_is_picked_and_the_flag_may_repeat_it():
    config = {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": True}
    for flag in (None, "gptq"):
        quant = resolve_quantization(config, flag)
        assert isinstance(quant, GPTQConfig)
        assert (quant.bits, quant.group_size, quant.desc_act) == (8, -1, True)
    assert resolve_quantization(None, None) is None
    assert isinstance(resolve_quantization(None, "int4"), Int4Config)


@pytest.mark.parametrize(
    ("config", "flag", "message"),
    [
        ({"quant_method": "hqq"}, None, "quantization 'hqq' is not supported; supported: " + ", ".join(supported_quantizations())),
        ({"quant_method": "gptq", "bits": 3}, None, "GPTQ with bits=3 is not supported; supported: 4, 8"),
        ({"quant_method": "gptq", "group_size": 0}, None, "GPTQ group_size must be -1 or > 0, got 0"),
        ({"quant_method": "awq", "version": "gemv"}, None, "AWQ version 'gemv' is not supported; supported: gemm"),
        ({"quant_method": "awq", "bits": 8}, None, "AWQ with bits=8 is not supported; supported: 4"),
        ({"quant_method": "awq"}, "gptq", "quantized with awq (config.json quantization_config) but --quantization asks for gptq"),
        (None, "gptq", "--quantization gptq needs a gptq checkpoint"),
        (None, "q4_k", "quantization 'q4_k' is not supported"),
        ({"bits": 4}, None, "quantization_config names no quant_method"),
    ],
)  # fmt: skip
def test_unservable_formats_fail_naming_what_is_supported(config, flag, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_quantization(config, flag)


def test_engine_start_fails_before_loading(make_checkpoint, tmp_path):
    dense = make_checkpoint("llama")
    for item in dense.iterdir():
        (tmp_path / item.name).symlink_to(item)
    (tmp_path / "config.json").unlink()
    config = json.loads((dense / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="GPTQ with bits=2 is not supported"):
        LLM(str(tmp_path), num_kv_blocks=8)


def test_unconverted_modules_match_by_name_and_fused_parts():
    assert is_layer_skipped("model.layers.0.mlp.down_proj", ["down_proj"], PACKED)
    assert not is_layer_skipped("model.layers.0.mlp.down_proj", ["up_proj"], PACKED)
    assert is_layer_skipped("model.layers.1.self_attn.qkv_proj", ["model.layers.1"], PACKED)
    assert is_layer_skipped("model.layers.0.mlp.gate_up_proj", ["re:.*mlp\\..*_proj"], PACKED)
    with pytest.raises(ConfigError, match="quantizes some of its fused parts"):
        is_layer_skipped("model.layers.0.self_attn.qkv_proj", ["k_proj"], PACKED)
