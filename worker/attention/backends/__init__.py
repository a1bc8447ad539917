"""Attention backends by name, imported lazily so a CPU install never pulls GPU code."""

from __future__ import annotations

import importlib

import torch

from worker.attention.backends.base import AttentionBackend

_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("worker.attention.backends.torch_reference", "TorchReferenceBackend"),
    "cpu": ("worker.attention.backends.cpu", "CPUAttentionBackend"),
    "triton": ("worker.attention.backends.triton", "TritonAttentionBackend"),
}
_DEFAULT_BY_DEVICE = {"cpu": "cpu", "cuda": "triton"}
# Backends whose constructor takes the device they serve.
_TAKES_DEVICE = {"triton"}


def _triton_installed() -> bool:
    from kernels.triton import triton_available

    return triton_available()


def register_backend(name: str, module: str, class_name: str, takes_device: bool = False) -> None:
    _BACKENDS[name] = (module, class_name)
    if takes_device:
        _TAKES_DEVICE.add(name)


def get_attention_backend(name: str | None, device: torch.device | str) -> AttentionBackend:
    """Backend `name` (None: the device's default: cpu on CPU, triton on CUDA)."""
    device = torch.device(device)
    if name is None:
        name = _DEFAULT_BY_DEVICE.get(device.type, "torch")
        if name == "triton" and not _triton_installed():
            name = "torch"  # a CUDA torch without triton: slow, but it serves
    if name not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {', '.join(sorted(_BACKENDS))}"
        )
    module, class_name = _BACKENDS[name]
    cls = getattr(importlib.import_module(module), class_name)
    return cls(device) if name in _TAKES_DEVICE else cls()


__all__ = ["AttentionBackend", "get_attention_backend", "register_backend"]
