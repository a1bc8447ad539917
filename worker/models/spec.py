"""What the engine needs to know about a checkpoint, read from its config files.

Both the current Hugging Face layout (`rope_parameters`, `dtype`,
`layer_types`) and the older one (`rope_theta` + `rope_scaling`,
`torch_dtype`) are accepted, so checkpoints of any vintage load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from shared.errors import UnsupportedModelError
from worker.layers.rotary import SUPPORTED_ROPE_TYPES, RopeSpec

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope: RopeSpec
    max_position_embeddings: int
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    checkpoint_dtype: torch.dtype
    # config.json's quantization_config as written (None: a dense checkpoint).
    quantization_config: dict[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def from_folder(cls, path: Path) -> ModelSpec:
        cfg = json.loads((path / "config.json").read_text())
        architectures = cfg.get("architectures") or []
        if not architectures:
            raise UnsupportedModelError(f"{path}/config.json names no architecture")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {cfg['hidden_act']!r} is not supported")
        num_heads = cfg["num_attention_heads"]
        num_layers = cfg["num_hidden_layers"]
        return cls(
            path=path,
            architecture=architectures[0],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            rope=_rope_spec(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            sliding_windows=_sliding_windows(cfg, num_layers),
            attention_bias=cfg.get("attention_bias", False),
            eos_token_ids=_eos_token_ids(path, cfg),
            bos_token_id=cfg.get("bos_token_id"),
            checkpoint_dtype=_DTYPES.get(
                str(cfg.get("dtype") or cfg.get("torch_dtype")), torch.float32
            ),
            quantization_config=cfg.get("quantization_config"),
        )

    def kv_bytes_per_token(self, dtype: torch.dtype, tp_size: int = 1) -> int:
        """K and V of one token over all layers, in one of `tp_size` ranks' caches
        (a rank holds num_kv_heads / tp_size heads, or one replicated head)."""
        element = torch.tensor([], dtype=dtype).element_size()
        kv_heads = max(1, self.num_kv_heads // tp_size)
        return 2 * self.num_layers * kv_heads * self.head_dim * element


def _rope_spec(cfg: dict[str, Any]) -> RopeSpec:
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    params = {**legacy, **params}
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return RopeSpec(
        theta=float(params.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 8192))
        ),
    )


def _sliding_windows(cfg: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    if not window:
        return (None,) * num_layers
    layer_types = cfg.get("layer_types")
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if "max_window_layers" in cfg:  # Qwen2/3: layers from max_window_layers on slide
        return tuple(window if i >= cfg["max_window_layers"] else None for i in range(num_layers))
    return (window,) * num_layers


def _eos_token_ids(path: Path, cfg: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids as `generate` uses them: generation_config.json first, then config.json."""
    eos = cfg.get("eos_token_id")
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        eos = json.loads(gen_path.read_text()).get("eos_token_id", eos)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)
