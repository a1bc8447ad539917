"""The C++ kernels run without the GIL: while one runs, another Python thread
makes progress (the worker's event loop and gRPC threads beside the engine thread).

A ticker thread stamps the clock in a loop and lets go of the GIL after each
stamp (time.sleep(0)), so the caller gets it back within a stamp whenever it
asks. Holding the GIL, a kernel call leaves no stamp inside its run; released,
the ticker gets the GIL at once and stamps throughout. Only the middle 80% of
each call counts, so a stamp taken as the call starts or ends never decides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from kernels.cpu import (
    load_cpu_kernels,
    load_fp8_kv_kernels,
    load_half_f32_kernels,
    load_weight_only_kernels,
)

# Long enough to span many of the ticker's GIL turns even on a loaded machine.
MIN_CALL_S = 0.05


def stamps_inside(call: Callable[[], object]) -> int:
    """How many ticker stamps fall in the middle 80% of `call`s that add up to MIN_CALL_S."""
    stamps: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0)  # releases the GIL: the caller never waits a switch interval

    call()  # warm: one-time allocations and OpenMP team start-up stay out of the window
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    windows = []
    try:
        while sum(end - start for start, end in windows) < MIN_CALL_S:
            start = time.perf_counter()
            call()
            windows.append((start, time.perf_counter()))
    finally:
        stop.set()
        ticker.join()
    inside = 0
    for start, end in windows:
        margin = 0.1 * (end - start)
        inside += sum(start + margin < t < end - margin for t in stamps)
    return inside


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def _main_kernels():
    kernels = load_cpu_kernels()
    if kernels is None:
        pytest.skip("no C++ toolchain to build the CPU kernels")
    return kernels


def test_a_call_that_holds_the_gil_leaves_no_stamp():
    # The check itself: sorted() runs in C with the GIL held throughout.
    values = torch.randperm(300_000).tolist()
    assert stamps_inside(lambda: sorted(values)) == 0


def test_elementwise_kernels_release_the_gil():
    kernels = _main_kernels()
    x, weight, residual = _bf16(4096, 576), _bf16(576), _bf16(4096, 576)
    assert stamps_inside(lambda: kernels.rms_norm(x, weight, 1e-5)) > 0
    assert stamps_inside(lambda: kernels.add_rms_norm(x, residual, weight, 1e-5)) > 0
    assert stamps_inside(lambda: kernels.silu_and_mul(_bf16(2048, 3072))) > 0
    logits = torch.randn(256, 49152)
    assert stamps_inside(lambda: kernels.row_argmax(logits)) > 0


def test_kv_write_and_attention_release_the_gil():
    kernels = _main_kernels()
    num_blocks, block_size, num_kv_heads, head_dim = 512, 16, 3, 64
    key_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    num_tokens = num_blocks * block_size
    key, value = (
        _bf16(num_tokens, num_kv_heads, head_dim),
        _bf16(num_tokens, num_kv_heads, head_dim),
    )
    slots = torch.arange(num_tokens)
    assert (
        stamps_inside(lambda: kernels.write_kv_cache(key, value, key_cache, value_cache, slots)) > 0
    )

    num_seqs, num_heads = 64, 9
    if not kernels.supports(num_heads, num_kv_heads, head_dim):
        pytest.skip("the decode kernel does not take these head shapes here")
    blocks_per_seq = num_blocks // num_seqs
    query = _bf16(num_seqs, num_heads, head_dim)
    tables = torch.arange(num_blocks, dtype=torch.int32).view(num_seqs, blocks_per_seq)
    seq_lens = torch.full((num_seqs,), blocks_per_seq * block_size, dtype=torch.int32)
    rows = torch.arange(num_seqs)
    out = torch.empty_like(query)

    def decode():
        kernels.paged_attention_decode(
            query, key_cache, value_cache, tables, seq_lens, rows, out, head_dim**-0.5, 0
        )

    assert stamps_inside(decode) > 0


def test_bf16_linear_releases_the_gil():
    kernels = _main_kernels()
    if not kernels.bf16_gemm_supported():
        pytest.skip("this build or CPU has no AVX512-BF16 linear")
    packed = kernels.pack_bf16_panels(_bf16(1536, 576))
    x = _bf16(256, 576)
    assert stamps_inside(lambda: kernels.bf16_panel_linear(x, packed)) > 0
    gate_up = kernels.pack_bf16_panels(_bf16(3072, 576))
    assert stamps_inside(lambda: kernels.bf16_panel_linear_silu(x, gate_up)) > 0


def test_weight_only_linear_releases_the_gil():
    kernels = load_weight_only_kernels()
    if kernels is None or not kernels.supported():
        pytest.skip("the weight-only linear needs the C++ build on a CPU with AVX512-BF16")
    weight = torch.randint(-127, 128, (1536, 576), dtype=torch.int8)
    packed, scales, x = kernels.pack_byte_panels(weight), torch.rand(1536), _bf16(256, 576)
    assert stamps_inside(lambda: kernels.weight_only_linear(x, packed, scales, None)) > 0


def test_fp8_cache_write_releases_the_gil():
    kernels = load_fp8_kv_kernels()
    if kernels is None:
        pytest.skip("no C++ toolchain to build the CPU kernels")
    key_cache = torch.zeros(512, 16, 3, 64, dtype=torch.float8_e4m3fn)
    value_cache = torch.zeros_like(key_cache)
    rows = _bf16(512 * 16, 3, 64)
    slots = torch.arange(512 * 16)

    def call():  # nothing but the kernel: a torch op inside would release the GIL itself
        kernels.write_kv_cache_fp8(rows, rows, key_cache, value_cache, slots)

    assert stamps_inside(call) > 0


def test_half_f32_linear_releases_the_gil():
    kernels = load_half_f32_kernels()
    if kernels is None or not kernels.half_f32_supported():
        pytest.skip("this build or CPU has no AVX2 half-storage linear")
    packed = kernels.pack_half_panels(_bf16(1536, 576))
    x = torch.randn(256, 576)
    assert stamps_inside(lambda: kernels.half_panel_linear(x, packed)) > 0
