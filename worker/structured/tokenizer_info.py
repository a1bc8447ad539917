"""The vocabulary as xgrammar sees it, built once per worker from the tokenizer files.

The worker never tokenizes text, but a grammar works on strings, so it needs
each token's bytes. Special tokens (BOS, chat markers) are given empty text,
which xgrammar reads as "never allowed": left as their literal text
("<|im_start|>") a grammar would accept them inside a JSON string, and the
router, which skips special tokens when detokenizing, would then return text
the grammar never produced. The stop tokens are the model's EOS ids: the one
way a finished grammar lets the request end.
"""

from __future__ import annotations

from pathlib import Path

from shared.errors import ConfigError


def build_tokenizer_info(
    tokenizer_path: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]
):
    """An `xgrammar.TokenizerInfo` of `vocab_size` entries (the model's logits width;
    ids past the tokenizer's vocabulary are never allowed)."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"structured outputs need the model's tokenizer, and none loads from "
            f"{tokenizer_path}: {exc}"
        ) from exc
    detected = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids)
    )
    if detected.vocab_type == xgr.VocabType.RAW:  # e.g. tiktoken: its vocab is not get_vocab()'s
        return detected
    encoded = [""] * vocab_size
    for token, token_id in tokenizer.get_vocab().items():
        if token_id < vocab_size:
            encoded[token_id] = token
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for token_id in special - set(eos_token_ids):
        if token_id < vocab_size:
            encoded[token_id] = ""
    return xgr.TokenizerInfo(
        encoded,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(eos_token_ids),
        add_prefix_space=detected.add_prefix_space,
    )
