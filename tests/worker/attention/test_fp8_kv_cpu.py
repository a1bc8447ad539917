"""--kv-cache-dtype fp8 on the default CPU backend: greedy tokens equal the
reference backend's fp8 run (chunked prefill, a cached prefix and decode steps
included), the budget holds twice a bf16 cache's tokens, and calibrated k/v
scales load from the checkpoint names vLLM reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.cpu import load_fp8_kv_kernels
from shared.errors import ConfigError
from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.config import CacheConfig
from worker.layers.attention import Attention
from worker.models.kv_scales import kv_scale_target
from worker.models.spec import ModelSpec
from worker.runner.kv_budget import plan_kv_cache

pytestmark = pytest.mark.skipif(
    load_fp8_kv_kernels() is None, reason="the C++ kernels did not build here"
)
GREEDY = SamplingParams(temperature=0, max_tokens=8)
# A shared 24-token head (a cached prefix for the later prompts), a prompt longer
# than the 32-token step budget (chunked), short ones.
_HEAD = random_prompts([24], seed=3)[0]
PROMPTS = [_HEAD + p for p in random_prompts([5, 50, 9], seed=4)] + random_prompts([3, 17])


def _run(path, backend, **options):
    llm = LLM(
        str(path),
        kv_cache_dtype="fp8",
        attention_backend=backend,
        max_model_len=128,
        num_kv_blocks=64,
        block_size=8,
        max_num_batched_tokens=32,
        enable_prefix_caching=True,
        **options,
    )
    out = llm.generate(PROMPTS, GREEDY, detokenize=False)
    return llm, [o.outputs[0].token_ids for o in out]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cpu_fp8_greedy_equals_reference_fp8(make_checkpoint, arch):
    path = make_checkpoint(arch)
    llm, tokens = _run(path, "cpu")
    assert llm.engine.core.runner.backend.fp8_kernels  # the kernels ran, not the fallback
    _, expected = _run(path, "torch")
    assert tokens == expected


def test_fp8_budget_holds_twice_the_bf16_tokens(make_checkpoint):
    path = make_checkpoint("llama")
    spec, cpu = ModelSpec.from_folder(path), torch.device("cpu")
    cache = CacheConfig(block_size=4, kv_cache_memory=2**20)
    bf16 = plan_kv_cache(cache, spec, torch.bfloat16, cpu, 0, 64)
    llm = LLM(
        str(path),
        dtype="bfloat16",
        max_model_len=64,
        block_size=4,
        kv_cache_memory=2**20,
        kv_cache_dtype="fp8",
    )
    budget = llm.engine.core.kv_budget
    assert budget.num_blocks == 2 * bf16.num_blocks
    assert "KV cache (fp8)" in budget.describe()


def _with_scales(src, dst, scales: dict[str, float], config_extra: dict | None = None):
    """A copy of checkpoint `src` carrying extra scale tensors (and config keys)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    (file,) = src.glob("*.safetensors")
    tensors = load_file(str(file))
    tensors.update({name: torch.tensor(value) for name, value in scales.items()})
    save_file(tensors, str(dst / file.name), metadata={"format": "pt"})
    if config_extra:
        config = json.loads((dst / "config.json").read_text())
        config.update(config_extra)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_calibrated_scales_load_and_match_reference(make_checkpoint, tmp_path):
    # vLLM fp8's names for layer 0, older AutoFP8's kv_scale for layer 1.
    scales = {
        "model.layers.0.self_attn.k_scale": 0.02,
        "model.layers.0.self_attn.v_scale": 0.005,
        "model.layers.1.self_attn.kv_scale": 0.01,
    }
    path = _with_scales(make_checkpoint("llama"), tmp_path / "scaled", scales)
    llm, tokens = _run(path, "cpu")
    layers = [m for m in llm.engine.core.runner.model.modules() if isinstance(m, Attention)]
    assert [(a.k_scale, a.v_scale) for a in layers] == [
        (pytest.approx(0.02), pytest.approx(0.005)),
        (pytest.approx(0.01), pytest.approx(0.01)),
    ]
    _, expected = _run(path, "torch")
    assert tokens == expected
    _, unscaled = _run(make_checkpoint("llama"), "cpu")
    assert tokens != unscaled  # scales this small saturate: they reach the cache


def test_compressed_tensors_kv_cache_scheme_loads_output_scales(make_checkpoint, tmp_path):
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {},
            "kv_cache_scheme": scheme,
        }
    }
    scales = {
        f"model.layers.{i}.self_attn.{p}_proj.output_scale": 0.5 for i in (0, 1) for p in "kv"
    }
    path = _with_scales(make_checkpoint("llama"), tmp_path / "ct", scales, config)
    llm, _ = _run(path, "cpu")
    layers = [m for m in llm.engine.core.runner.model.modules() if isinstance(m, Attention)]
    assert {(a.k_scale, a.v_scale) for a in layers} == {(0.5, 0.5)}


def test_scale_names():
    assert kv_scale_target("model.layers.3.self_attn.k_proj.k_scale") == (
        "model.layers.3.self_attn",
        "k",
    )
    assert kv_scale_target("model.layers.3.self_attn.v_proj.output_scale") == (
        "model.layers.3.self_attn",
        "v",
    )
    assert kv_scale_target("model.layers.3.self_attn.q_scale") == ("model.layers.3.self_attn", "q")
    assert kv_scale_target("model.layers.3.self_attn.k_proj.weight_scale") is None


def test_per_head_scales_are_refused(make_checkpoint, tmp_path):
    src = make_checkpoint("llama")
    path = _with_scales(src, tmp_path / "bad", {})
    (file,) = path.glob("*.safetensors")
    tensors = load_file(str(file))
    tensors["model.layers.0.self_attn.k_scale"] = torch.ones(2)
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="one positive per-tensor scale"):
        LLM(str(path), kv_cache_dtype="fp8", num_kv_blocks=64)
