"""Floating-point operations a decoder-only model needs for a workload's requests.

Counted as multiply-adds x 2, for the work every engine must do (no padding, no
recomputation, no prefix cache):

* linear layers: 2 x (their weight count) per computed token: q/k/v/o and
  gate/up/down projections of every layer.
* LM head: 2 x hidden_size x vocab_size, only for tokens whose logits are used.
  An engine computes them for the last prompt token and for every fed-back output
  token, i.e. max_tokens rows per request (the last output token is sampled but
  never fed back, so it costs nothing).
* attention: 4 x num_heads x head_dim x context per computed token and layer
  (q.k scores and the weighted sum of values, 2 x head_dim each per key), where
  context = position + 1 (at most the layer's sliding window).

A request of P prompt and O output tokens computes T = P + O - 1 tokens
(positions 0 .. T-1). Norms, RoPE, activations and softmax are left out: they are
O(hidden) per token, well under 1% here.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.workloads import Workload


@dataclass(frozen=True)
class ModelFlops:
    linear_flops_per_token: int  # all layers, LM head excluded
    lm_head_flops_per_token: int
    attention_flops_per_key: tuple[int, ...]  # per layer: 4 x num_heads x head_dim
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention

    @classmethod
    def from_spec(cls, spec) -> ModelFlops:
        """From a `worker.models.spec.ModelSpec`."""
        hidden, heads, kv_heads, head_dim = (
            spec.hidden_size,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
        )
        attention_weights = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o; k, v
        mlp_weights = 3 * hidden * spec.intermediate_size  # gate, up, down
        return cls(
            linear_flops_per_token=2 * spec.num_layers * (attention_weights + mlp_weights),
            lm_head_flops_per_token=2 * hidden * spec.vocab_size,
            attention_flops_per_key=(4 * heads * head_dim,) * spec.num_layers,
            sliding_windows=tuple(spec.sliding_windows),
        )

    def request_flops(self, prompt_len: int, max_tokens: int) -> int:
        num_computed = prompt_len + max_tokens - 1
        flops = num_computed * self.linear_flops_per_token
        flops += max_tokens * self.lm_head_flops_per_token
        for per_key, window in zip(self.attention_flops_per_key, self.sliding_windows):
            flops += per_key * _sum_of_contexts(num_computed, window)
        return flops

    def workload_flops(self, workload: Workload) -> int:
        return sum(
            self.request_flops(len(r.prompt_token_ids), r.max_tokens) for r in workload.requests
        )


def _sum_of_contexts(num_tokens: int, window: int | None) -> int:
    """sum over positions p < num_tokens of min(p + 1, window)."""
    if window is None or window >= num_tokens:
        return num_tokens * (num_tokens + 1) // 2
    return window * (window + 1) // 2 + (num_tokens - window) * window
