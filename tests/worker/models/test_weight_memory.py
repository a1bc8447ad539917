"""Resident weight memory: every tensor the modules hold once, packed copies and
float32 copies included, the KV cache not."""

from __future__ import annotations

import torch
from torch import nn

from worker.layers.attention import Attention
from worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from worker.models.weight_memory import module_tensors, resident_weight_bytes


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(16, 8, dtype=torch.bfloat16), requires_grad=False)
        self.register_buffer("scale", torch.zeros(4), persistent=False)  # 16 bytes
        self._scratch = torch.zeros(1000)  # private: not counted


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(100, 8)  # float32: 3200 bytes
        self.proj = _Linear()  # 256 + 16 bytes
        self.attn = Attention(2, 4, 0.5, 1, None)
        self.attn.kv_cache = torch.zeros(1000, dtype=torch.bfloat16)  # KV, not a weight
        self.lm_head = ParallelLMHead(100, 8)
        self.lm_head.tie_to(self.embed_tokens)  # the same table: counted once


def test_parameters_and_buffers_once_kv_cache_and_private_tensors_not():
    assert resident_weight_bytes(_Model()) == 3200 + 256 + 16


def test_packed_and_float32_copies_are_counted():
    model = _Model()
    model.lm_head.packed_weight = torch.zeros(100, 8, dtype=torch.bfloat16)  # 1600
    model.proj.weight_f32 = torch.zeros(16, 8)  # 512: the copy for batches past 8 rows
    assert resident_weight_bytes(model) == 3200 + 256 + 16 + 1600 + 512


def test_module_tensors_names_its_own_tensors_only():
    model = _Model()
    model.proj.packed_f32 = None
    assert sorted(module_tensors(model.proj)) == ["scale", "weight"]
    assert module_tensors(model) == {}
