"""Weight bytes a decoded token reads, as stored: lookup tables out, packed copies in."""

from __future__ import annotations

import torch
from torch import nn

from bench.weight_bytes import params_bytes, stored_weight_bytes
from worker.layers.attention import Attention
from worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from worker.layers.layernorm import RMSNorm


class _Linear(nn.Module):
    def __init__(self, rows: int, cols: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, cols, dtype=dtype), requires_grad=False)


class _Model(nn.Module):
    def __init__(self, tied: bool, packed: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(100, 8)  # float32: 3200 bytes
        self.proj = _Linear(16, 8, torch.bfloat16)  # 256 bytes
        self.norm = RMSNorm(8, 1e-5)  # float32: 32 bytes
        self.attn = Attention(2, 4, 0.5, 1, None)
        self.attn.kv_cache = torch.zeros(1000, dtype=torch.bfloat16)  # KV, not a weight
        self.lm_head = ParallelLMHead(100, 8)
        if tied:
            self.lm_head.tie_to(self.embed_tokens)
        if packed:  # a packed copy the head computes from (half the bytes here)
            self.lm_head.packed_weight = torch.zeros(100, 8, dtype=torch.bfloat16)


def test_untied_head_counts_its_own_weight_not_the_table():
    assert stored_weight_bytes(_Model(tied=False, packed=False)) == 256 + 32 + 3200


def test_tied_head_counts_the_table_once_through_itself():
    assert stored_weight_bytes(_Model(tied=True, packed=False)) == 256 + 32 + 3200


def test_packed_head_counts_the_packed_copy_only():
    assert stored_weight_bytes(_Model(tied=True, packed=True)) == 256 + 32 + 1600


def test_float32_copies_beside_half_panels_are_not_counted():
    model = _Model(tied=False, packed=False)
    model.proj.weight_f32 = torch.zeros(16, 8)  # oneDNN's copy for batches past 8 rows
    model.lm_head.packed_weight = torch.zeros(100, 8, dtype=torch.bfloat16)  # half panels
    model.lm_head.packed_f32 = torch.zeros(100, 8)
    assert stored_weight_bytes(model) == 256 + 32 + 1600


def test_params_bytes():
    assert params_bytes(1000, "bfloat16") == 2000
    assert params_bytes(1000, "float32") == 4000
    assert params_bytes(1000, "mystery") is None
