"""Quantization formats by name (vLLM's names), imported lazily.

`resolve_quantization` turns a checkpoint's `quantization_config` and the
`--quantization` flag into the one `QuantizationConfig` the model's linear
layers take their methods from (None: every layer dense).
"""

from __future__ import annotations

import importlib
from typing import Any

from shared.errors import ConfigError
from worker.layers.quantization.base import LinearMethodBase, QuantizationConfig
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

_METHODS: dict[str, tuple[str, str]] = {
    "gptq": ("worker.layers.quantization.gptq", "GPTQConfig"),
    "awq": ("worker.layers.quantization.awq", "AWQConfig"),
    "bitsandbytes": ("worker.layers.quantization.bitsandbytes", "BitsAndBytesConfig"),
    "compressed-tensors": (
        "worker.layers.quantization.compressed_tensors",
        "CompressedTensorsConfig",
    ),
    "fp8": ("worker.layers.quantization.fp8", "Fp8Config"),
    "int8": ("worker.layers.quantization.online", "Int8Config"),
    "int4": ("worker.layers.quantization.online", "Int4Config"),
}


def register_quantization(name: str, module: str, class_name: str) -> None:
    _METHODS[name] = (module, class_name)


def supported_quantizations() -> list[str]:
    return sorted(_METHODS)


def get_quantization_config_class(name: str) -> type[QuantizationConfig]:
    if name not in _METHODS:
        raise ConfigError(
            f"quantization {name!r} is not supported; supported: "
            f"{', '.join(supported_quantizations())}"
        )
    module, class_name = _METHODS[name]
    return getattr(importlib.import_module(module), class_name)


def resolve_quantization(
    checkpoint_config: dict[str, Any] | None, flag: str | None
) -> QuantizationConfig | None:
    """The format to serve: the checkpoint's own, or `--quantization` on the fly
    from a dense checkpoint. A flag naming another format than the checkpoint's
    fails, as in vLLM."""
    if checkpoint_config is None:
        if flag is None:
            return None
        cls = get_quantization_config_class(flag)
        if not cls.quantizes_at_load:
            on_the_fly = [n for n in _METHODS if get_quantization_config_class(n).quantizes_at_load]
            raise ConfigError(
                f"--quantization {flag} needs a {flag} checkpoint (config.json with a "
                f"quantization_config); from a dense checkpoint these quantize at load: "
                f"{', '.join(sorted(on_the_fly))}"
            )
        return cls.from_config({})
    method = str(checkpoint_config.get("quant_method", "")).lower().replace("_", "-")
    if not method:
        raise ConfigError("config.json's quantization_config names no quant_method")
    if flag is not None and flag != method:
        raise ConfigError(
            f"the checkpoint is quantized with {method} (config.json quantization_config) "
            f"but --quantization asks for {flag}; drop the flag or pass --quantization {method}"
        )
    return get_quantization_config_class(method).from_config(checkpoint_config)


__all__ = [
    "LinearMethodBase",
    "QuantizationConfig",
    "UnquantizedLinearMethod",
    "get_quantization_config_class",
    "register_quantization",
    "resolve_quantization",
    "supported_quantizations",
]
