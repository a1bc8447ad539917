"""Logit adjustments that depend on the tokens a request has seen.

For each row, applied in this order to the raw logits `l[t]`:

1. logit bias:          l[t] += bias[t]
2. min_tokens:          l[t] = -inf for EOS and stop tokens while fewer than
                        min_tokens tokens have been generated
3. repetition penalty:  for t in prompt or output: l[t] /= r if l[t] > 0 else l[t] *= r
4. frequency/presence:  l[t] -= f * count_out(t) + p * (count_out(t) > 0)

where count_out(t) counts t among the generated tokens only (the OpenAI
definition) and r, f, p are the request's repetition, frequency and presence
penalties.
"""

from __future__ import annotations

import torch


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_seqs, max_len] ids padded with `vocab_size` -> [num_seqs, vocab_size] counts."""
    counts = torch.zeros(
        token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device
    )
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,  # [num_seqs, vocab_size], float32
    prompt_ids: torch.Tensor,  # [num_seqs, max_prompt_len], padded with vocab_size
    output_ids: torch.Tensor,  # [num_seqs, max_output_len], padded with vocab_size
    presence: torch.Tensor,  # [num_seqs]
    frequency: torch.Tensor,  # [num_seqs]
    repetition: torch.Tensor,  # [num_seqs]
) -> torch.Tensor:
    vocab_size = logits.shape[1]
    output_counts = token_counts(output_ids, vocab_size)
    in_output = output_counts > 0
    seen = in_output | (token_counts(prompt_ids, vocab_size) > 0)
    rep = repetition.unsqueeze(1)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    return logits - frequency.unsqueeze(1) * output_counts - presence.unsqueeze(1) * in_output
