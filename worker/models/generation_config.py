"""The model creator's recommended sampling defaults (`generation_config.json`).

As vLLM does with `--generation-config auto`: the checkpoint's own
temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens
(as max_tokens) become the defaults of requests that leave them unset.
`vllm` ignores the file (the engine defaults); any other value is a folder
to read `generation_config.json` from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.errors import ConfigError
from shared.logging import get_logger

logger = get_logger(__name__)

# generation_config.json key -> SamplingParams field
_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def load_sampling_defaults(model_folder: Path, mode: str) -> dict[str, Any]:
    """SamplingParams fields the model recommends; empty under `vllm` or without a file."""
    if mode == "vllm":
        return {}
    folder = model_folder if mode == "auto" else Path(mode)
    path = folder / "generation_config.json"
    if not path.is_file():
        if mode != "auto":
            raise ConfigError(f"--generation-config {mode}: no generation_config.json there")
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    defaults = {field: config[key] for key, field in _KEYS.items() if config.get(key) is not None}
    if defaults:
        logger.info(
            "sampling defaults from %s (requests that leave them unset): %s; "
            "--generation-config vllm ignores them",
            path,
            ", ".join(f"{k}={v}" for k, v in defaults.items()),
        )
    return defaults
