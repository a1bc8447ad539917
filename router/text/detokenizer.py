"""Token ids to text, incrementally, never splitting a character.

Byte-level tokenizers cut multi-byte UTF-8 characters across tokens, and
tokenizers that mark spaces (SentencePiece's "▁") decode a token differently
at the start of a text than after other tokens. So the text of new tokens is
the difference between decoding a short window with and without them:

```
ids:  ... prompt tail | emitted ............ | not yet emitted
          ^ prefix_offset                    ^ read_offset     ^ end
new text = decode(ids[prefix_offset:end]) - decode(ids[prefix_offset:read_offset])
```

held back while it ends in U+FFFD (an incomplete character). The window
starts with the last few prompt tokens, so the first output token decodes as
it would in the middle of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Prompt tokens that prime the window: enough for any merge or space rule.
INITIAL_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        decoder: Decoder,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self._ids = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text that is now final (maybe empty)."""
        self._ids.extend(token_ids)
        return self._advance(at_end=False)

    def flush(self) -> str:
        """The sequence ended: whatever is still held, incomplete characters replaced."""
        return self._advance(at_end=True)

    def _advance(self, at_end: bool) -> str:
        if self._read_offset == len(self._ids):
            return ""

        def decode(ids: list[int]) -> str:
            return self._decoder.decode(ids, self._skip_special_tokens, self._spaces)

        window = self._ids[self._prefix_offset :]
        prefix_text = decode(window[: self._read_offset - self._prefix_offset])
        full_text = decode(window)
        # NOTE: a window whose text did not grow (e.g. only skipped special tokens)
        # is not emitted either, but the tokens stay in it until text arrives.
        if len(full_text) <= len(prefix_text) or (full_text.endswith(_REPLACEMENT) and not at_end):
            if at_end:
                self._read_offset = len(self._ids)
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]
