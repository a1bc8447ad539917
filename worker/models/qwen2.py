"""Qwen2: the Llama shape with a bias on the q, k and v projections."""

from __future__ import annotations

from worker.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
