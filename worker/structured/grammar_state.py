"""One request's place in its grammar: fills its bitmask row, advances per token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class GrammarState:
    """An xgrammar matcher over one sample's output tokens.

    NOTE: each of a request's `n` samples has its own state (its own output),
    all from the one compiled grammar.
    """

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self._compiled = compiled
        self._matcher = xgr.GrammarMatcher(compiled)

    @classmethod
    def from_tokens(cls, compiled: Any, output_token_ids: Sequence[int]) -> GrammarState:
        """A state that has accepted `output_token_ids` (a recomputed request's)."""
        state = cls(compiled)
        for token in output_token_ids:
            if not state.accept(token):
                raise ValueError(f"token {token} does not follow the grammar")
        return state

    def rebuild(self, output_token_ids: Sequence[int]) -> None:
        """Start over from the compiled grammar and accept `output_token_ids`."""
        self._matcher = GrammarState.from_tokens(self._compiled, output_token_ids)._matcher

    def accept(self, token_id: int) -> bool:
        return self._matcher.accept_token(int(token_id))

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """bitmask: [num_rows, ceil(vocab_size / 32)] int32; bit j of word w allows
        token 32 * w + j."""
        self._matcher.fill_next_token_bitmask(bitmask, row)
