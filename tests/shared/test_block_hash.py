from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

from shared.block_hash import ROOT_HASH, block_hashes, extend_block_hashes, hash_block

# Golden values: any change here changes worker and router keys at once and
# must come with a new BLOCK_HASH_SCHEME.
GOLDEN = ["985ef6c7194ba8ddf3a05db2e0661be4", "6660d975e8746e940895e623f470dde3"]


def test_golden_values_and_definition():
    hashes = block_hashes(list(range(8)), 4)
    assert [h.hex() for h in hashes] == GOLDEN
    expected = hashlib.sha256(ROOT_HASH + struct.pack("<4I", 0, 1, 2, 3)).digest()[:16]
    assert hashes[0] == expected


def test_same_in_another_process():
    code = "from shared.block_hash import block_hashes; print(block_hashes(list(range(8)), 4)[1].hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == GOLDEN[1]


def test_chain_depends_on_every_earlier_block():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # same second block, different parent
    assert a[1] == hash_block(a[0], [5, 6, 7, 8])


def test_partial_blocks_have_no_hash_and_extension_matches_batch():
    tokens = list(range(11))
    assert len(block_hashes(tokens, 4)) == 2
    grown: list[bytes] = []
    for n in range(1, 12):
        extend_block_hashes(grown, tokens[:n], 4)
    assert grown == block_hashes(tokens, 4)


def test_salt_isolates_chains_through_the_first_block():
    plain = block_hashes(list(range(8)), 4)
    salted = block_hashes(list(range(8)), 4, salt=b"tenant")
    assert salted[0].hex() == "2f04ee56bebe3e34a3e1884767b9f249"
    assert salted[0] != plain[0] and salted[1] != plain[1]
    assert salted[1] == hash_block(salted[0], [4, 5, 6, 7])
