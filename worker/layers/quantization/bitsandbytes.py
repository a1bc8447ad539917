"""bitsandbytes NF4: weights quantized at load by the bitsandbytes library
(`pip install 'pagoda[bitsandbytes]'`; it runs on CPU too).

Each weight [out, in], loaded dense, becomes bitsandbytes' packed NF4 codes
([out * in / 2, 1] uint8) and one float32 absmax per block of 64 values
(blocks run along rows; a row is whole blocks when in % 64 == 0). `apply` is
`bitsandbytes.matmul_4bit`; the twin dequantizes with the library and
multiplies with `F.linear`. Pre-quantized bitsandbytes checkpoints are not
read: load the dense checkpoint with --quantization bitsandbytes.
"""

from __future__ import annotations

import torch.nn.functional as F

from shared.errors import ConfigError
from worker.layers.quantization.base import QuantizationConfig, is_layer_skipped, replace_params
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

BLOCK_SIZE = 64


def _bnb():
    try:
        import bitsandbytes
        import bitsandbytes.functional
    except ImportError as exc:
        raise ConfigError(
            "--quantization bitsandbytes needs the bitsandbytes package: "
            "pip install 'pagoda[bitsandbytes]'"
        ) from exc
    return bitsandbytes


class BitsAndBytesConfig(QuantizationConfig):
    name = "bitsandbytes"
    quantizes_at_load = True

    def __init__(self, skip: list[str]) -> None:
        self.skip = skip

    @classmethod
    def from_config(cls, config):
        if config:
            raise ConfigError(
                "pre-quantized bitsandbytes checkpoints are not supported (load_in_4bit / "
                "load_in_8bit in config.json); supported: the dense checkpoint with "
                "--quantization bitsandbytes (NF4 at load), or a GPTQ, AWQ, compressed-tensors "
                "or fp8 checkpoint"
            )
        _bnb()  # a missing package fails at start, before loading
        return cls([])

    def describe(self):
        return "bitsandbytes nf4 (quantized at load)"

    def get_linear_method(self, prefix):
        if is_layer_skipped(prefix, self.skip, self.packed_modules):
            return UnquantizedLinearMethod()
        return BitsAndBytesNF4Method()


class BitsAndBytesNF4Method(UnquantizedLinearMethod):
    def process_weights_after_loading(self, layer):
        bnb = _bnb()
        per_rank = layer.input_size_per_partition
        if per_rank != layer.input_size and (
            per_rank % BLOCK_SIZE or layer.input_size % BLOCK_SIZE
        ):
            # NF4 blocks run along each row: a rank's column slice quantizes as the
            # whole matrix does only when the blocks fall within it.
            raise ConfigError(
                f"--quantization bitsandbytes at tensor-parallel size {layer.tp_size}: "
                f"{layer.prefix} has {per_rank} of its {layer.input_size} inputs per rank, "
                f"and NF4's blocks of {BLOCK_SIZE} need a multiple of {BLOCK_SIZE} in both; "
                "use a tensor-parallel size that divides the rows so, or another method"
            )
        packed, state = bnb.functional.quantize_4bit(
            layer.weight.data, blocksize=BLOCK_SIZE, quant_type="nf4"
        )
        replace_params(layer, ["weight"], nf4_weight=packed, nf4_absmax=state.absmax)
        state.absmax = layer.nf4_absmax.data  # one copy, counted with the weights
        layer.nf4_state = state

    def apply(self, layer, x, bias):
        return _bnb().matmul_4bit(x, layer.nf4_weight.t(), quant_state=layer.nf4_state, bias=bias)

    def apply_silu_and_mul(self, layer, x, bias):
        return None


def nf4_dense(layer, dtype):
    """The twin's weight [out, in] in `dtype`."""
    bnb = _bnb()
    return bnb.functional.dequantize_4bit(layer.nf4_weight.data, layer.nf4_state).to(dtype)


def apply_twin(layer, x, bias):
    return F.linear(x, nf4_dense(layer, x.dtype), bias)
