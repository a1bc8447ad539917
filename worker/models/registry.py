"""Model architectures by the name in a checkpoint's config.json, imported lazily."""

from __future__ import annotations

import importlib

from torch import nn

from shared.errors import UnsupportedModelError

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("worker.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("worker.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("worker.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("worker.models.qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODELS:
        raise UnsupportedModelError(
            f"architecture {architecture!r} is not supported; "
            f"supported: {', '.join(supported_architectures())}"
        )
    module, class_name = _MODELS[architecture]
    return getattr(importlib.import_module(module), class_name)
