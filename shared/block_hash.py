"""The one chained block hash shared by the worker's prefix cache and the router.

A block's hash covers its parent's hash and its own token ids, so equal hashes
mean equal prefixes. It is computed with SHA-256 over a fixed byte encoding, so
it is the same in every process and on every machine (never Python's `hash()`).
Changing anything here changes both sides at once: bump `BLOCK_HASH_SCHEME`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BLOCK_HASH_SCHEME = "sha256-16-v1"
BLOCK_HASH_BYTES = 16
# The parent of a sequence's first block.
ROOT_HASH = bytes(BLOCK_HASH_BYTES)

BlockHash = bytes


def hash_block(parent: BlockHash, token_ids: Sequence[int], salt: bytes | None = None) -> BlockHash:
    """Hash one full block given its parent's hash (ROOT_HASH for the first).

    `salt` (a per-tenant cache salt) only enters the first block; it isolates
    whole chains because every later hash depends on it.
    """
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    if salt:
        h.update(b"\x00salt")
        h.update(salt)
    return h.digest()[:BLOCK_HASH_BYTES]


def extend_block_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    salt: bytes | None = None,
) -> list[BlockHash]:
    """Append the hashes of blocks of `token_ids` that became full since `hashes`.

    `hashes` covers the first len(hashes) full blocks of `token_ids`; it is
    extended in place and returned. Partial trailing blocks get no hash.
    """
    num_full = len(token_ids) // block_size
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i else ROOT_HASH
        block = token_ids[i * block_size : (i + 1) * block_size]
        hashes.append(hash_block(parent, block, salt if i == 0 else None))
    return hashes


def block_hashes(
    token_ids: Sequence[int], block_size: int, salt: bytes | None = None
) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, in order."""
    return extend_block_hashes([], token_ids, block_size, salt)
