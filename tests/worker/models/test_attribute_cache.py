"""A loaded model's parameters and submodules are plain instance attributes, and
reassigning one still replaces what the model reads."""

from __future__ import annotations

import torch
from torch import nn

from worker.models.attribute_cache import cache_module_attributes
from worker.models.loader import build_model
from worker.models.spec import ModelSpec


def test_loaded_model_reads_its_registered_tensors_from_the_instance(make_checkpoint):
    spec = ModelSpec.from_folder(make_checkpoint("llama"))
    model = build_model(spec, torch.float32, torch.device("cpu"), 128)
    checked = 0
    for module in model.modules():
        for name, value in [*module._parameters.items(), *module._modules.items()]:
            assert module.__dict__[name] is value, name
            checked += 1
    assert checked > 20
    layer = model.model.layers[0].self_attn.qkv_proj
    assert layer.weight is layer._parameters["weight"] and layer.bias is None


def test_reassigning_after_caching_replaces_the_cached_attribute():
    module = nn.Linear(4, 2)
    cache_module_attributes(module)
    fresh = nn.Parameter(torch.ones(2, 4))
    module.weight = fresh  # nn.Module.__setattr__ drops the instance entry
    assert module.weight is fresh and module._parameters["weight"] is fresh
    assert torch.equal(module(torch.ones(1, 4)), torch.full((1, 2), 4.0) + module.bias)
