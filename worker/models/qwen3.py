"""Qwen3: the Llama shape with RMSNorm on each query and key head before RoPE."""

from __future__ import annotations

from worker.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
