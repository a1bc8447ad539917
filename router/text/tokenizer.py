"""A Hugging Face fast tokenizer, loaded with `tokenizers` alone.

The router needs encode, decode, the special tokens and the chat template;
`transformers` would bring torch along (seconds of start-up and hundreds of
MB per router) for nothing more, so the files are read directly:
`tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import tokenizers

from shared.errors import ConfigError

_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
)


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class Tokenizer:
    def __init__(
        self, backend: tokenizers.Tokenizer, config: dict[str, Any], chat_template: str | None
    ) -> None:
        self.backend = backend
        self.config = config
        self.chat_template = chat_template
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.is_byte_level = isinstance(backend.decoder, tokenizers.decoders.ByteLevel)
        # Added tokens (specials and the like): id -> text.
        self.added_tokens = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}

    @classmethod
    def load(cls, source: str, revision: str | None = None) -> Tokenizer:
        """From a local folder, or a Hub id (only the tokenizer files are downloaded)."""
        folder = Path(source)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            try:
                folder = Path(
                    snapshot_download(source, revision=revision, allow_patterns=list(_FILES))
                )
            except Exception as exc:
                raise ConfigError(f"cannot load the tokenizer {source!r}: {exc}") from exc
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(
                f"{source!r} has no tokenizer.json (the router needs a fast tokenizer); "
                "point --tokenizer at a folder or Hub id that has one"
            )
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        config: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            if (folder / name).is_file():
                config.update(json.loads((folder / name).read_text()))
        return cls(backend, config, _find_chat_template(folder, config))

    @property
    def longest_token_chars(self) -> int:
        """Characters of the longest vocabulary piece: no token stands for more text."""
        return max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        ids = list(token_ids)
        added = self.added_tokens
        if skip_special_tokens or spaces_between_special_tokens or not any(i in added for i in ids):
            return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        # vLLM's spaces_between_special_tokens=False: added tokens written as they are,
        # the runs between them decoded on their own, nothing joined by spaces (some
        # decoders, WordPiece's for one, put a space around every added token).
        pieces, run = [], []
        for token_id in ids:
            if token_id in added:
                if run:
                    pieces.append(self.backend.decode(run, skip_special_tokens=False))
                    run = []
                pieces.append(added[token_id])
            else:
                run.append(token_id)
        if run:
            pieces.append(self.backend.decode(run, skip_special_tokens=False))
        return "".join(pieces)

    def token_text(self, token_id: int) -> str:
        """One token on its own, for logprobs (special tokens included)."""
        return self.backend.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own UTF-8 bytes, even when it holds only part of a character."""
        piece = self.backend.id_to_token(token_id)
        decoder = _byte_decoder()
        if self.is_byte_level and piece is not None and all(c in decoder for c in piece):
            return [decoder[c] for c in piece]
        return list(self.token_text(token_id).encode())


def _find_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.json").is_file():
        template = json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def read_chat_template(value: str) -> str:
    """`--chat-template`: a file, or the template itself (as vLLM accepts it)."""
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:  # e.g. a template too long to be a file name
        pass
    if "{{" in value or "{%" in value:
        return value
    raise ConfigError(f"--chat-template: no such file, and not a Jinja template: {value!r}")
