"""Find a checkpoint, build its model and fill it from safetensors files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.distributed import get_tp_size
from worker.layers.quantization import QuantizationConfig
from worker.models.attribute_cache import cache_module_attributes
from worker.models.checkpoint_slice import CheckpointSlice, materialize
from worker.models.kv_scales import kv_scale_target, load_kv_scale
from worker.models.registry import get_model_class
from worker.models.spec import ModelSpec

logger = get_logger(__name__)

_HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]


def resolve_model_path(model: str, revision: str | None = None) -> Path:
    """A local folder as is; anything else is a Hub id, downloaded once to the HF cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ConfigError(f"{path} has no config.json; is it a Hugging Face checkpoint folder?")
        return path
    if model.startswith((".", "/", "~")):
        raise ConfigError(f"model folder {model} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, revision=revision, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # network, auth, missing repo: all end the start-up the same way
        raise ConfigError(f"could not fetch {model!r} from the Hugging Face Hub: {exc}") from exc


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path} holds no *.safetensors weights")
    return files


def iter_checkpoint_tensors(
    path: Path, lazy: bool = False
) -> Iterator[tuple[str, torch.Tensor | CheckpointSlice]]:
    """lazy: yield unread slices, so each weight loader reads only its shard."""
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, CheckpointSlice(f, name) if lazy else f.get_tensor(name)


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in checkpoint_files(path))


def load_weights(model: nn.Module, path: Path) -> None:
    """Copy every checkpoint tensor into its parameter (or shard of one)."""
    params = dict(model.named_parameters())
    packed = getattr(model, "packed_modules_mapping", {})
    expected = {name: len(packed.get(name.split(".")[-2], [None])) for name in params}
    loaded: dict[str, int] = {}
    tied = model.spec.tie_word_embeddings
    # Under tensor parallelism a rank reads only its slice of each tensor; at size 1
    # every loader keeps the whole tensor anyway.
    lazy = get_tp_size() > 1
    for name, tensor in iter_checkpoint_tensors(path, lazy):
        if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
            continue
        if name not in params and kv_scale_target(name) is not None:  # FP8 KV cache scales
            load_kv_scale(model, name, materialize(tensor))
            continue
        target, shard_id = name, None
        for fused, parts in packed.items():
            for part, part_id in parts:
                if f".{part}." in name:
                    target, shard_id = name.replace(f".{part}.", f".{fused}."), part_id
        param = params.get(target)
        if param is None:
            raise ConfigError(
                f"checkpoint tensor {name!r} has no parameter in {model.spec.architecture}"
            )
        loader = getattr(param, "weight_loader", None)
        if not lazy:
            tensor = tensor.to(param.dtype)
        if loader is None:
            param.data.copy_(materialize(tensor))
        else:
            loader(param, tensor, shard_id)
        loaded[target] = loaded.get(target, 0) + 1
    missing = [n for n, count in expected.items() if loaded.get(n, 0) != count]
    if missing:
        raise ConfigError(f"checkpoint at {path} lacks weights for: {', '.join(missing[:8])}")
    # Layers that repack what they loaded (quantized or prepacked linears, the LM head).
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if hook is not None:
            hook()


def build_model(
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int,
    quant_config: QuantizationConfig | None = None,
) -> nn.Module:
    """The model of `spec` with its weights loaded; `quant_config` (from
    `resolve_quantization`) gives its linear layers their storage format."""
    model_cls = get_model_class(spec.architecture)
    if quant_config is not None:
        packed = getattr(model_cls, "packed_modules_mapping", {})
        quant_config.packed_modules = {
            fused: [part for part, _ in parts] for fused, parts in packed.items()
        }
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(spec, max_position, quant_config)
    finally:
        torch.set_default_dtype(previous)
    load_weights(model, spec.path)
    model.eval()
    cache_module_attributes(model)  # last: the weights are final now
    return model
