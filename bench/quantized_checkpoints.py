"""Quantized checkpoints made locally from dense ones, in each format's on-disk layout.

Round-to-nearest quantization of every decoder linear (the embeddings, norms
and LM head stay dense, as the real tools leave them), packed as GPTQ or AWQ
write it. Beside each quantized folder goes its twin: the same model with
every quantized weight replaced by its dequantized float32 value, which
`transformers` runs as the oracle. This module is its own packer: it shares
no code with the engine's loaders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds output column AWQ_ORDER[i]


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) -> the int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, m] codes -> [n / pf, m] int32, codes of rows i*pf .. i*pf+pf-1 in word i
    (the first in the lowest bits)."""
    pf = 32 // bits
    grouped = codes.to(torch.int64).view(-1, pf, codes.shape[1])
    words = sum(grouped[:, k] << (bits * k) for k in range(pf))
    return _to_int32(words)


def pack_columns(codes: torch.Tensor, bits: int, order: tuple[int, ...] | None = None):
    """[n, m] codes -> [n, m / pf] int32 along columns; `order[k]` is the column
    (within each word's pf) that bits k*bits.. hold (default 0, 1, 2, ...)."""
    pf = 32 // bits
    order = order or tuple(range(pf))
    grouped = codes.to(torch.int64).view(codes.shape[0], -1, pf)
    words = sum(grouped[..., order[k]] << (bits * k) for k in range(pf))
    return _to_int32(words)


def rtn(weight: torch.Tensor, bits: int, g_idx: torch.Tensor, num_groups: int, sym: bool):
    """Round-to-nearest codes of W [out, in] per (row, group of inputs):
    (codes [out, in], scales [out, groups] float16, zeros [out, groups] int64),
    scales rounded to float16 before the codes are made, as the tools store them."""
    maxq = 2**bits - 1
    out_features = weight.shape[0]
    scales = torch.empty(out_features, num_groups)
    zeros = torch.empty(out_features, num_groups, dtype=torch.int64)
    for g in range(num_groups):
        cols = weight[:, g_idx == g]
        lo = cols.min(dim=1).values.clamp(max=0)
        hi = cols.max(dim=1).values.clamp(min=0)
        if sym:
            hi = torch.maximum(-lo, hi)
            scales[:, g] = 2 * hi / maxq
            zeros[:, g] = 2 ** (bits - 1)
        else:
            scales[:, g] = (hi - lo) / maxq
            # Zero 0 cannot be stored as GPTQ's zero - 1: keep it from 1 up.
            zeros[:, g] = torch.round(-lo / scales[:, g]).clamp(1, maxq).to(torch.int64)
    scales = scales.clamp(min=1e-5).half()
    s, z = scales.float()[:, g_idx], zeros[:, g_idx]
    codes = (torch.round(weight / s) + z).clamp(0, maxq).to(torch.int64)
    return codes, scales, zeros


def dequantize(codes, scales, zeros, g_idx) -> torch.Tensor:
    return (codes - zeros[:, g_idx]).float() * scales.float()[:, g_idx]


def _group_index(in_features: int, group_size: int, desc_act: bool, seed: int) -> torch.Tensor:
    size = in_features if group_size == -1 else group_size
    g_idx = torch.arange(in_features) // size
    if desc_act:  # act-order: inputs visited in a permuted order, groups taken along it
        order = torch.randperm(in_features, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty_like(g_idx).scatter_(0, order, g_idx)
    return g_idx


def quantize_gptq(weight, bits=4, group_size=128, desc_act=False, sym=True, seed=0):
    """W [out, in] -> (GPTQ tensors by suffix, dequantized W)."""
    in_features = weight.shape[1]
    g_idx = _group_index(in_features, group_size, desc_act, seed)
    num_groups = int(g_idx.max()) + 1
    codes, scales, zeros = rtn(weight, bits, g_idx, num_groups, sym)
    tensors = {
        "qweight": pack_rows(codes.t().contiguous(), bits),  # [in / pf, out]
        "qzeros": pack_columns((zeros - 1).t().contiguous(), bits),  # [groups, out / pf]
        "scales": scales.t().contiguous(),  # [groups, out]
        "g_idx": g_idx.to(torch.int32),
    }
    return tensors, dequantize(codes, scales, zeros, g_idx)


def quantize_awq(weight, group_size=128):
    """W [out, in] -> (AWQ GEMM tensors by suffix, dequantized W); asymmetric 4-bit."""
    in_features = weight.shape[1]
    g_idx = _group_index(in_features, group_size, False, 0)
    codes, scales, zeros = rtn(weight, 4, g_idx, int(g_idx.max()) + 1, sym=False)
    tensors = {
        "qweight": pack_columns(codes.t().contiguous(), 4, AWQ_ORDER),  # [in, out / 8]
        "qzeros": pack_columns(zeros.t().contiguous(), 4, AWQ_ORDER),  # [groups, out / 8]
        "scales": scales.t().contiguous(),  # [groups, out]
    }
    return tensors, dequantize(codes, scales, zeros, g_idx)


FP8 = torch.float8_e4m3fn


def _fp8(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 codes, dequantized W) for `scale` broadcast over W."""
    codes = (weight / scale).clamp(-448, 448).to(FP8)
    return codes, codes.float() * scale


def quantize_fp8(weight, block=None, static=False):
    """W [out, in] -> (vLLM fp8 tensors, dequantized W): one scale per tensor, or
    per [bo, bi] block (weight_scale_inv)."""
    if block is None:
        scale = (weight.abs().max() / 448).clamp(min=1e-12)
        codes, dense = _fp8(weight, scale)
        tensors = {"weight": codes, "weight_scale": scale.reshape(())}
    else:
        out_features, in_features = weight.shape
        blocks = weight.view(out_features // block[0], block[0], in_features // block[1], block[1])
        scale = (blocks.abs().amax(dim=(1, 3)) / 448).clamp(min=1e-12)  # [out/bo, in/bi]
        codes, dense = _fp8(blocks, scale[:, None, :, None])
        codes, dense = codes.view(weight.shape), dense.view(weight.shape)
        tensors = {"weight": codes, "weight_scale_inv": scale}
    if static:
        tensors["input_scale"] = torch.tensor(0.02)
    return tensors, dense


def quantize_compressed_int(weight, bits=4, group_size=-1, sym=True, actorder=False, seed=0):
    """W [out, in] -> (compressed-tensors pack-quantized tensors, dequantized W)."""
    out_features, in_features = weight.shape
    g_idx = _group_index(in_features, group_size, actorder, seed)
    codes, scales, zeros = rtn(weight, bits, g_idx, int(g_idx.max()) + 1, sym)
    tensors = {
        # Signed values + 2**(bits-1), as compressed-tensors' pack_to_int32 stores them.
        "weight_packed": pack_columns(codes, bits),  # [out, in / pf]
        "weight_scale": scales,  # [out, groups]
        "weight_shape": torch.tensor([out_features, in_features]),
    }
    if not sym:
        tensors["weight_zero_point"] = pack_rows(zeros, bits)  # [out / pf, groups]
    if actorder:
        tensors["weight_g_idx"] = g_idx.to(torch.int32)
    return tensors, dequantize(codes, scales, zeros, g_idx)


def quantize_compressed_fp8(weight, strategy="channel"):
    """W [out, in] -> (compressed-tensors float-quantized tensors, dequantized W)."""
    if strategy == "channel":
        scale = (weight.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12)  # [out, 1]
    else:
        scale = (weight.abs().max() / 448).clamp(min=1e-12).reshape(1)
    codes, dense = _fp8(weight, scale)
    return {"weight": codes, "weight_scale": scale}, dense


def dequantized_int8(weight: torch.Tensor) -> torch.Tensor:
    """What `--quantization int8` serves for W [out, in]: symmetric per row."""
    scale = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
    return torch.round(weight / scale).clamp(-127, 127) * scale


def dequantized_int4(weight: torch.Tensor) -> torch.Tensor:
    """What `--quantization int4` serves for W [out, in]: min-max per row and group
    of 128 inputs (64 or 32 where 128 does not divide them, else the row)."""
    out_features, in_features = weight.shape
    size = next((g for g in (128, 64, 32) if in_features % g == 0), in_features)
    groups = weight.view(out_features, -1, size)
    lo = groups.amin(dim=2, keepdim=True).clamp(max=0)
    hi = groups.amax(dim=2, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    zero = torch.round(-lo / scale).clamp(0, 15)
    codes = (torch.round(groups / scale) + zero).clamp(0, 15)
    return ((codes - zero) * scale).view(out_features, in_features)


def dequantized_fp8(weight: torch.Tensor) -> torch.Tensor:
    """What `--quantization fp8` serves for W [out, in]: e4m3 with a scale per row."""
    return _fp8(weight, (weight.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12))[1]


def dequantized_nf4(weight: torch.Tensor) -> torch.Tensor:
    """What `--quantization bitsandbytes` serves: the library's NF4 round trip."""
    import bitsandbytes.functional as bnb

    return bnb.dequantize_4bit(*bnb.quantize_4bit(weight, blocksize=64, quant_type="nf4"))


def _input_seed(module: str) -> int:
    """One act-order permutation per input a layer's projections share (q/k/v,
    gate/up), as GPTQ's order comes from that input's statistics."""
    parent, _, leaf = module.rpartition(".")
    family = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(leaf, leaf)
    return sum(ord(c) * (i + 1) for i, c in enumerate(f"{parent}.{family}")) % 2**31


def _compressed_tensors(options: dict[str, Any]):
    kind = options.pop("kind")
    if kind == "float":
        strategy = options.get("strategy", "channel")
        weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True}
        inputs = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
        quantize, fmt = (lambda w, i: quantize_compressed_fp8(w, strategy)), "float-quantized"
    else:
        bits, group_size = options.get("bits", 4), options.get("group_size", -1)
        actorder = options.get("actorder", False)
        weights = {
            "num_bits": bits,
            "type": "int",
            "symmetric": options.get("sym", True),
            "strategy": "channel" if group_size == -1 else "group",
            "group_size": None if group_size == -1 else group_size,
            "actorder": "group" if actorder else None,
        }
        inputs = None

        def quantize(w, i):
            return quantize_compressed_int(w, seed=i, **options)

        fmt = "pack-quantized"
    config = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
        },
        "ignore": ["lm_head"],
    }
    return quantize, config


def _quantizer(fmt: str, options: dict[str, Any]):
    if fmt == "gptq":
        return lambda w, i: quantize_gptq(w, seed=i, **options), {
            "quant_method": "gptq",
            "bits": options.get("bits", 4),
            "group_size": options.get("group_size", 128),
            "desc_act": options.get("desc_act", False),
            "sym": options.get("sym", True),
            "checkpoint_format": "gptq",
        }
    if fmt == "awq":
        return lambda w, i: quantize_awq(w, **options), {
            "quant_method": "awq",
            "bits": 4,
            "group_size": options.get("group_size", 128),
            "zero_point": True,
            "version": "gemm",
        }
    if fmt == "fp8":
        block = options.get("block")
        return lambda w, i: quantize_fp8(w, **options), {
            "quant_method": "fp8",
            "activation_scheme": "static" if options.get("static") else "dynamic",
            **({"weight_block_size": list(block)} if block else {}),
        }
    if fmt == "compressed-tensors":
        return _compressed_tensors(dict(options))
    if fmt in ("int8", "int4", "fp8-at-load", "bitsandbytes"):  # quantized at load: stays dense
        twin = {
            "int8": dequantized_int8,
            "int4": dequantized_int4,
            "fp8-at-load": dequantized_fp8,
            "bitsandbytes": dequantized_nf4,
        }[fmt]
        return lambda w, i: ({"weight": w}, twin(w)), None
    raise ValueError(f"no packer for {fmt!r}")


def write_quantized_checkpoint(
    dense: Path, out: Path, fmt: str, not_converted: tuple[str, ...] = (), **options: Any
) -> tuple[Path, Path]:
    """Quantize the dense checkpoint `dense` into `out/quantized` (format `fmt`;
    int8 and int4 leave it dense, to be quantized at load) and write
    `out/dequantized`, its float32 twin. Linears whose name ends in one
    of `not_converted` stay dense (listed as modules_to_not_convert)."""
    quantized_dir, dequantized_dir = out / "quantized", out / "dequantized"
    for folder in (quantized_dir, dequantized_dir):
        folder.mkdir(parents=True, exist_ok=True)
        for item in dense.iterdir():
            if item.suffix != ".safetensors" and item.name != "model.safetensors.index.json":
                shutil.copy(item, folder / item.name)
    quantize, quant_config = _quantizer(fmt, options)
    if not_converted and quant_config is not None:
        quant_config["modules_to_not_convert"] = list(not_converted)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(dense.glob("*.safetensors")):
        state.update(load_file(str(file)))
    quantized: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, tensor in sorted(state.items()):
        module = name.removesuffix(".weight")
        is_linear = name.endswith(".weight") and module.split(".")[-1] in LINEARS
        if not is_linear or module.split(".")[-1] in not_converted:
            quantized[name] = tensor
            dequantized[name] = tensor.float()
            continue
        parts, weight = quantize(tensor.float(), _input_seed(module))
        quantized.update({f"{module}.{suffix}": t for suffix, t in parts.items()})
        dequantized[name] = weight
    save_file(quantized, str(quantized_dir / "model.safetensors"))
    save_file(dequantized, str(dequantized_dir / "model.safetensors"))
    config = json.loads((dense / "config.json").read_text())
    if quant_config is not None:
        config_out = {**config, "quantization_config": quant_config}
        (quantized_dir / "config.json").write_text(json.dumps(config_out, indent=2))
    (dequantized_dir / "config.json").write_text(
        json.dumps({**config, "torch_dtype": "float32"}, indent=2)
    )
    return quantized_dir, dequantized_dir
