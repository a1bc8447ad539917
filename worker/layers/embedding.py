"""Token embedding and LM head, sharded over the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.distributed import get_tp_rank, get_tp_size, tp_all_gather, tp_all_reduce
from worker.layers import cpu_half_f32, cpu_packed


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the (padded) vocabulary."""

    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype=None) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings = num_embeddings
        padded = -(-num_embeddings // self.tp_size) * self.tp_size
        self.num_embeddings_per_partition = padded // self.tp_size
        self.vocab_start = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end = self.vocab_start + self.num_embeddings_per_partition
        # [num_embeddings_per_partition, embedding_dim]
        self.weight = nn.Parameter(
            torch.zeros(
                self.num_embeddings_per_partition,
                embedding_dim,
                dtype=params_dtype or torch.get_default_dtype(),
            ),
            requires_grad=False,
        )
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        end = min(self.vocab_end, self.num_embeddings)
        # narrow(): a CheckpointSlice reads only this rank's rows.
        rows = loaded.narrow(0, self.vocab_start, end - self.vocab_start)
        param.data[: end - self.vocab_start].copy_(rows)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local_ids = (input_ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return tp_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to logits over the full vocabulary."""

    packed_weight: torch.Tensor | None = None
    packed_is_half_f32 = False  # packed_weight is cpu_half_f32's panels, not cpu_packed's
    packed_f32: torch.Tensor | None = None  # beside half panels: cpu_half_f32.float32_copy

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def process_weights_after_loading(self) -> None:
        # A copy, not a replacement: a tied weight is also the embedding table.
        # Half panels where lossless on a CPU without fast bf16 (cpu_half_f32.py).
        self.packed_weight = cpu_half_f32.pack_if_lossless(self.weight.data)
        self.packed_is_half_f32 = self.packed_weight is not None
        if self.packed_is_half_f32:
            self.packed_f32 = cpu_half_f32.float32_copy(self.weight.data)
        if self.packed_weight is None and cpu_packed.can_pack(self.weight):
            self.packed_weight = cpu_packed.pack(self.weight.data)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[num_seqs, hidden_size] -> [num_seqs, vocab_size]"""
        if self.packed_is_half_f32:
            logits = cpu_half_f32.half_linear(
                hidden_states, self.packed_weight, None, self.packed_f32
            )
        elif self.packed_weight is not None:
            logits = cpu_packed.packed_linear(hidden_states, self.packed_weight, None)
        else:
            logits = F.linear(hidden_states, self.weight)
        logits = tp_all_gather(logits, dim=-1)
        return logits[..., : self.num_embeddings]
