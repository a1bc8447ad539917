"""Submodules and parameters of a loaded model as plain instance attributes.

`nn.Module` keeps parameters, buffers and submodules in its own dicts and finds
them through `__getattr__`, which Python calls only after the ordinary lookup
failed: ~0.5 us per `self.qkv_proj` or `self.weight`. A decoder layer's forward
reads about 20 of them, 600 per step of a 30-layer model: 10% of the host time
of a batch-1 decode step. Once the weights are final (after loading and
repacking), each module's parameters and submodules are also written into its
instance `__dict__`, where the ordinary lookup finds them at once.

NOTE: stays true as long as they are reassigned through `setattr` with a Parameter
or a Module (nn.Module.__setattr__ then drops the instance entry and the lookup
falls back to `__getattr__`, still correct). Nothing after loading sets one to
None or deletes one; `quantization/base.replace_params` does, before this runs.
"""

from __future__ import annotations

from torch import nn


def cache_module_attributes(model: nn.Module) -> None:
    for module in model.modules():
        for name, param in module._parameters.items():
            module.__dict__[name] = param
        for name, child in module._modules.items():
            module.__dict__[name] = child
