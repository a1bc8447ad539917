"""Launch configurations of the paged attention kernel, chosen per batch shape.

Plain Python (no kernel), so both loaded copies of the kernel module share it.
"""

from __future__ import annotations

from dataclasses import dataclass


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class AttentionConfig:
    """One launch configuration (no autotuning: it needs a driver, and tests pick
    tiny ones). block_m: tile rows (query positions x the group's heads); tile:
    keys per K/V tile; num_splits: split-K ranges (1 = none, else a power of 2)."""

    block_m: int
    tile: int
    num_splits: int = 1
    num_warps: int = 4


def choose_config(
    num_heads: int,
    num_kv_heads: int,
    num_seqs: int,
    max_query_len: int,
    target_programs: int,
) -> AttentionConfig:
    """Decode-only steps take 16-row tiles (tl.dot's minimum) and split-K when
    num_seqs x num_kv_heads programs would leave the GPU's `target_programs`
    slots idle; steps with prefill rows take 64-row tiles. Depends only on the
    batch's shape, so a CUDA graph captured for a shape keeps its choice."""
    group = num_heads // num_kv_heads
    if max_query_len == 1:
        block_m = max(16, next_power_of_2(group))
        programs = num_seqs * num_kv_heads
        splits = 1
        while splits < 16 and programs * splits * 2 <= target_programs:
            splits *= 2
        return AttentionConfig(block_m=block_m, tile=32, num_splits=splits)
    return AttentionConfig(block_m=max(64, next_power_of_2(group)), tile=32, num_warps=4)
