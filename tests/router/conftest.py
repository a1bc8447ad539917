"""Router test fixtures: the tiny checkpoint's tokenizer, loaded the router's way."""

from __future__ import annotations

import pytest

from router.text.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tokenizer(make_checkpoint) -> Tokenizer:
    return Tokenizer.load(str(make_checkpoint("llama")))
