"""Llama, and everything shaped like it (Mistral; Qwen2 and Qwen3 subclass it).

Parameter names follow Hugging Face's, with q/k/v and gate/up fused
(`qkv_proj`, `gate_up_proj`); `packed_modules_mapping` tells the loader
which checkpoint tensors land in which shard.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from worker.distributed import get_tp_size
from worker.layers.activation import SiluAndMul
from worker.layers.attention import Attention
from worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from worker.layers.layernorm import RMSNorm
from worker.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from worker.layers.quantization import QuantizationConfig
from worker.layers.rotary import get_rope
from worker.models.decode_plan import DecodePlan, build_decode_plan
from worker.models.spec import ModelSpec

# NOTE: inside the model, submodules are called through .forward(), not __call__:
# nn.Module.__call__ checks for hooks on every call (about 1 us), and a decode step
# makes ~11 such calls per layer, 330 per step of a 30-layer model: 15% of the host
# time of a batch-1 step. Pagoda registers no hooks on model modules.


class LlamaMLP(nn.Module):
    def __init__(self, spec: ModelSpec, quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        inter = spec.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            spec.hidden_size,
            [inter, inter],
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            inter, spec.hidden_size, quant_config=quant_config, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.gate_up_proj.silu_and_mul(x)  # fused where the weight format has it
        if hidden is None:
            hidden = self.act_fn.forward(self.gate_up_proj.forward(x))
        return self.down_proj.forward(hidden)


class LlamaAttention(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        max_position: int,
        qkv_bias: bool,
        qk_norm: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> None:
        super().__init__()
        head_dim = spec.head_dim
        self.qkv_proj = QKVParallelLinear(
            spec.hidden_size,
            head_dim,
            spec.num_heads,
            spec.num_kv_heads,
            bias=qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            spec.num_heads * head_dim,
            spec.hidden_size,
            bias=spec.attention_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.head_dim = head_dim
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, spec.rms_norm_eps)
        self.rotary_emb = get_rope(head_dim, max_position, spec.rope, torch.get_default_dtype())
        self.attn = Attention(
            self.num_heads,
            head_dim,
            head_dim**-0.5,
            self.num_kv_heads,
            spec.sliding_windows[layer_idx],
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj.forward(hidden_states)  # [num_tokens, q_size + 2 * kv_size]
        # split_with_sizes: Tensor.split's Python wrapper costs 1.2 us more, per layer.
        q, k, v = qkv.split_with_sizes([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:  # per-head RMSNorm over head_dim, before RoPE (Qwen3)
            q = self.q_norm.forward(q.reshape(-1, self.num_heads, self.head_dim)).view(q.shape)
            k = self.k_norm.forward(k.reshape(-1, self.num_kv_heads, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb.forward(positions, q, k)
        return self.o_proj.forward(self.attn.forward(q, k, v))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        max_position: int,
        qkv_bias,
        qk_norm,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(
            spec, layer_idx, max_position, qkv_bias, qk_norm, quant_config, f"{prefix}.self_attn"
        )
        self.mlp = LlamaMLP(spec, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm.forward(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm.forward(hidden_states, residual)
        hidden_states = self.self_attn.forward(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm.forward(hidden_states, residual)
        return self.mlp.forward(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        max_position: int,
        qkv_bias: bool,
        qk_norm: bool,
        quant_config: QuantizationConfig | None,
    ):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                spec, i, max_position, qkv_bias, qk_norm, quant_config, f"model.layers.{i}"
            )
            for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        # Decode steps (and any step of 1-6 rows) run the layers' kernels bound once
        # (decode_plan.py); built at the first step, when the weights are final.
        # False: not built yet.
        self.decode_plan: DecodePlan | bool | None = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens.forward(input_ids)  # [num_tokens, hidden_size]
        plan = self.decode_plan
        if plan is False:
            plan = self.decode_plan = build_decode_plan(self)
        if plan is not None and plan.covers(input_ids.shape[0]):
            return plan.forward(hidden_states, positions)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer.forward(positions, hidden_states, residual)
        hidden_states, _ = self.norm.forward(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    # None: q/k/v bias follows config.attention_bias.
    qkv_bias: bool | None = None
    qk_norm: bool = False
    packed_modules_mapping: ClassVar[dict[str, list[tuple[str, str | int]]]] = {
        "qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
        "gate_up_proj": [("gate_proj", 0), ("up_proj", 1)],
    }

    def __init__(
        self, spec: ModelSpec, max_position: int, quant_config: QuantizationConfig | None = None
    ) -> None:
        super().__init__()
        self.spec = spec
        self.tp_size = get_tp_size()
        qkv_bias = spec.attention_bias if self.qkv_bias is None else self.qkv_bias
        self.model = LlamaModel(spec, max_position, qkv_bias, self.qk_norm, quant_config)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> hidden states [num_tokens, hidden_size]."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[num_seqs, hidden_size] -> [num_seqs, vocab_size]"""
        return self.lm_head.compute_logits(hidden_states)
