"""Masks the constrained rows of a step's logits with their grammars' bitmasks.

Applied in the model runner before the sampler, so every sampling path
(greedy argmax included) sees the masked logits; logprobs are those of the
masked distribution, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from worker.structured.grammar_state import GrammarState


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    # [num_rows, ceil(vocab_size / 32)] int32, all tokens allowed
    return torch.full((num_rows, -(-vocab_size // 32)), -1, dtype=torch.int32)


def fill_bitmask(states: Sequence[GrammarState], vocab_size: int) -> torch.Tensor:
    """One row per state, in order (CPU: the matchers live there)."""
    bitmask = allocate_bitmask(len(states), vocab_size)
    for row, state in enumerate(states):
        state.fill_bitmask(bitmask, row)
    return bitmask


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_rows, words] int32 -> [num_rows, vocab_size] bool, True = allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [num_rows, words, 32]
    return bits.flatten(1)[:, :vocab_size].bool()


def apply_bitmask_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]
) -> None:
    """The plain-PyTorch twin: -inf on every disallowed token of `rows`, in place."""
    index = torch.tensor(list(rows), dtype=torch.int64, device=logits.device)
    allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[1])
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """logits: [num_seqs, vocab_size]; bitmask row i masks logits row rows[i]. Returns the
    masked logits: in place on the device, or on CPU as a float32 copy masked by
    xgrammar's kernel (5x its twin for 64 x 49152 rows; the sampler widens to
    float32 anyway)."""
    if logits.device.type == "cpu":
        import xgrammar as xgr

        logits = logits.float()
        full = allocate_bitmask(logits.shape[0], logits.shape[1])
        full[list(rows)] = bitmask
        xgr.apply_token_bitmask_inplace(
            logits, full, vocab_size=logits.shape[1], indices=list(rows)
        )
        return logits
    apply_bitmask_reference(logits, bitmask, rows)
    return logits
