"""Quantization methods by name; the linear layers delegate to one of them."""

from __future__ import annotations

from collections.abc import Callable

from worker.layers.quantization.base import LinearMethodBase, UnquantizedLinearMethod

_METHODS: dict[str, Callable[[], LinearMethodBase]] = {"none": UnquantizedLinearMethod}


def register_quantization(name: str, factory: Callable[[], LinearMethodBase]) -> None:
    _METHODS[name] = factory


def get_linear_method(name: str | None) -> LinearMethodBase:
    name = name or "none"
    if name not in _METHODS:
        raise ValueError(f"unknown quantization {name!r}; supported: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]()


__all__ = [
    "LinearMethodBase",
    "UnquantizedLinearMethod",
    "get_linear_method",
    "register_quantization",
]
