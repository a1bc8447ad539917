"""Incremental detokenizing never emits a broken character and adds up to the whole."""

from __future__ import annotations

import random

import pytest

from bench.checkpoints import _CORPUS
from router.text.detokenizer import IncrementalDetokenizer

MULTI_BYTE = [s for s in _CORPUS if any(ord(c) > 127 for c in s)]


@pytest.mark.parametrize("text", MULTI_BYTE)
def test_one_token_at_a_time_never_splits_a_character(tokenizer, text):
    ids = tokenizer.encode(text)
    # The byte-level BPE really does cut characters across tokens here.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.push([i]) for i in ids] + [detokenizer.flush()]
    assert all("\ufffd" not in d for d in deltas), deltas
    assert "".join(deltas) == text


def test_the_prompt_primes_the_window(tokenizer):
    # A space-led first token decodes with its space after a prompt.
    prompt, output = tokenizer.encode("The quick"), tokenizer.encode(" brown fox")
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    text = "".join(detokenizer.push([i]) for i in output) + detokenizer.flush()
    assert text == " brown fox"


@pytest.mark.parametrize("seed", range(5))
def test_any_token_soup_adds_up_to_decoding_it_whole(tokenizer, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(200)]
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    pieces, start = [], 0
    while start < len(ids):  # the worker may deliver several tokens at once
        size = rng.randint(1, 4)
        pieces.append(detokenizer.push(ids[start : start + size]))
        start += size
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("hello") + [2]  # <|im_end|>
    for skip, expected in ((True, "hello"), (False, "hello<|im_end|>")):
        detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
        assert detokenizer.push(ids) + detokenizer.flush() == expected
