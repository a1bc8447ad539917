"""The one scoped channel through which attention metadata reaches the layers.

Model `forward` signatures stay Hugging Face-shaped (input_ids, positions);
only attention layers read the context, and only inside `forward_context`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from worker.attention.metadata import AttentionMetadata

_current: AttentionMetadata | None = None


@contextmanager
def forward_context(metadata: AttentionMetadata) -> Iterator[None]:
    global _current
    previous, _current = _current, metadata
    try:
        yield
    finally:
        _current = previous


def get_forward_context() -> AttentionMetadata:
    assert _current is not None, "attention layer called outside forward_context()"
    return _current
