"""Attention backends by name, imported lazily so a CPU install never pulls GPU code."""

from __future__ import annotations

import importlib

from worker.attention.backends.base import AttentionBackend

_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("worker.attention.backends.torch_reference", "TorchReferenceBackend"),
    "cpu": ("worker.attention.backends.cpu", "CPUAttentionBackend"),
}
_DEFAULT_BY_DEVICE = {"cpu": "cpu", "cuda": "torch"}


def register_backend(name: str, module: str, class_name: str) -> None:
    _BACKENDS[name] = (module, class_name)


def get_attention_backend(name: str | None, device_type: str) -> AttentionBackend:
    name = name or _DEFAULT_BY_DEVICE.get(device_type, "torch")
    if name not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {', '.join(sorted(_BACKENDS))}"
        )
    module, class_name = _BACKENDS[name]
    return getattr(importlib.import_module(module), class_name)()


__all__ = ["AttentionBackend", "get_attention_backend", "register_backend"]
