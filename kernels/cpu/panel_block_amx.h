// The AMX micro-kernel and loop of gemm_bf16.cpp: one or two 16-row tiles of x
// against a 32-column panel, the panel's two 16-column halves as B tiles as
// they lie in memory (no repacking), and the order in which a linear's row
// pairs, chunks and units go out to the threads.
//
// Shapes (as gemm_bf16.cpp): panel [K/2][32][2] bf16 (K a multiple of 32); x
// [M, K] bf16 (row stride K); out: a panel's 32 columns per row at a row stride
// of ldo; bias: 32 float per panel or null.
#pragma once

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "panel_block_dp.h"

#ifdef PAGODA_AMX
namespace pagoda_amx {

// The panels' width, as the vdpbf16ps kernel reads them: here two 16-column B tiles.
using pagoda_dp::kPanel;

// With AMX the same panels are tile operands as they lie: rows kp .. kp + 15 of a
// panel, at a 128-byte stride, are the B tile of columns 0-15 (first 64 bytes of
// each row) or 16-31 (last 64). A is 16 rows x 32 k of x. Tiles: 0-3 C (row
// block b, column half h -> 2 b + h), 4-5 A, 6-7 B.
struct RowBlock {
  const uint16_t* x;  // 16 rows at stride k (a zero-padded copy for a short tail)
  int64_t first_row;
  int rows;
};

// The next row pair's x, fetched into L2 a few lines per k step while the
// current pair runs against the first group of panels: a prefill step's x comes
// from L3 or DRAM, and 16-row tile loads at a stride of K are no pattern for the
// hardware prefetcher.
struct RowPrefetch {
  const char* base[2] = {};
  int64_t lines[2] = {};
  int64_t done = 0;
  int per_step = 0;

  void step() {
    for (int n = 0; n < per_step; ++n, ++done) {
      const int part = done < lines[0] ? 0 : 1;
      const int64_t line = part == 0 ? done : done - lines[0];
      if (part == 1 && line >= lines[1]) return;
      _mm_prefetch(base[part] + 64 * line, _MM_HINT_T1);
    }
  }
};

// One or two 16-row blocks x one panel, over all of K (a multiple of 32); out
// points at the first block's first row.
// pipe (may be null): a pending SiLU, advanced at each k step while the tile
// products run. prefetch: the panel is cold (the first row pair of a chunk to
// meet it); later row pairs find it in L2.
template <int kBlocks, typename Pipe>
void amx_panel_block(const RowBlock* blocks, int64_t k, const uint16_t* panel, const float* bias, uint16_t* out,
                     int64_t ldo, Pipe* pipe, bool prefetch, RowPrefetch* ahead) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kBlocks == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t ldx = k * 2;
  for (int64_t kk = 0; kk < k; kk += 32) {
    const uint16_t* b = panel + kk * kPanel;  // k pair kk / 2
    // The whole 2 KB of B four steps (8 KB) ahead: weights stream from DRAM at
    // decode sizes, and the hardware prefetcher alone left 40% of the read
    // bandwidth unused (30 SmolLM2 layers at 32 rows: 26 -> 16 ms).
    if (prefetch)
      for (int line = 0; line < 32; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(b + 4 * 32 * kPanel) + 64 * line, _MM_HINT_T0);
    // B with the streaming hint (tileloaddt1), so the panel passing through does
    // not evict the row pair's A from L1, which at K = 576 (36 KB) then serves
    // every panel of the group. Both changes together, at 4096 rows of 10 SmolLM2
    // layers on an AMX Xeon (family 6 model 167), 5 alternating passes: qkv 20.4
    // -> 18.3 ms, o 10.7 -> 9.4, gate/up 66.2 -> 54.4 (2.7 TFLOP/s), down (K =
    // 1536: A is 96 KB) 31.6 -> 31.9; either alone: 1.01x and 0.97x the time.
    _tile_stream_loadd(6, b, 128);
    _tile_stream_loadd(7, b + kPanel, 128);
    _tile_loadd(4, blocks[0].x + kk, ldx);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kBlocks == 2) {
      _tile_loadd(5, blocks[1].x + kk, ldx);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (pipe != nullptr) pipe->step(pipe->per_step);
    if (ahead != nullptr) ahead->step();
  }
  alignas(64) float c[kBlocks][16][kPanel];
  _tile_stored(0, &c[0][0][0], kPanel * 4);
  _tile_stored(1, &c[0][0][16], kPanel * 4);
  if constexpr (kBlocks == 2) {
    _tile_stored(2, &c[1][0][0], kPanel * 4);
    _tile_stored(3, &c[1][0][16], kPanel * 4);
  }
  const __m512 b0 = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias != nullptr ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
  for (int blk = 0; blk < kBlocks; ++blk)
    for (int r = 0; r < blocks[blk].rows; ++r) {
      uint16_t* o = out + (blocks[blk].first_row - blocks[0].first_row + r) * ldo;
      const __m512 v0 = _mm512_add_ps(_mm512_load_ps(&c[blk][r][0]), b0);
      const __m512 v1 = _mm512_add_ps(_mm512_load_ps(&c[blk][r][16]), b1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), (__m256i)_mm512_cvtneps_pbh(v0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), (__m256i)_mm512_cvtneps_pbh(v1));
    }
}

constexpr int64_t kRowSplitWeightBytes = 1280 * 1024;
constexpr int64_t kPanelMajorBlocks = 4;

// unit(u, first row, rows, &pipe, block): output unit u's rows, each of its
// panels through block(panel, bias, dst, ldd) (gemm_bf16.cpp's panel_linear);
// Pipe: the SiLU of a gate/up unit, run during the next unit's products.
template <typename Pipe, typename Unit>
void amx_linear(const uint16_t* x, int64_t m, int64_t k, int64_t units, int64_t panels_per_unit, Unit&& unit) {
  // A tile reads 16 whole rows: a short tail runs from a zero-padded copy.
  std::vector<uint16_t> tail;
  std::vector<RowBlock> blocks;
  for (int64_t r = 0; r + 16 <= m; r += 16) blocks.push_back({x + r * k, r, 16});
  if (m % 16 != 0) {
    const int64_t first = m / 16 * 16;
    tail.assign(16 * k, 0);
    std::memcpy(tail.data(), x + first * k, (m - first) * k * 2);
    blocks.push_back({tail.data(), first, static_cast<int>(m - first)});
  }
  // Many rows: a chunk of x that stays in L2 (about 512 KB) runs against all of
  // a thread's panels before the next; otherwise every panel would stream all of x.
  // Within a chunk, a row pair runs against a group of units (panels filling
  // about 1 MB: with the chunk, 1.5 MB of the AMX Xeons' 2 MB L2) before the
  // next pair, so out is written along its rows. Unit by unit, each 32-row call
  // stored one 64-byte line per row, a column walking down out: 25-30% of a
  // 4096-row call went to those stores (Emerald Rapids), and groups take
  // 0.66-0.93x the time of that order per SmolLM2 linear there.
  const int64_t nb = static_cast<int64_t>(blocks.size());
  const int64_t chunk = std::max<int64_t>(2, (512 * 1024) / (k * 2 * 16) / 2 * 2);  // blocks, even
  // A few row pairs (decode): panel by panel instead, every pair right after
  // the first, so the weight streams from DRAM the whole time; a group made the
  // second pair's pass over it run from L2 with no DRAM read under way (the
  // 49152-row LM head at 64 rows took 1.75x a plain read of its bytes).
  const int64_t group = nb <= kPanelMajorBlocks ? 1 : std::max<int64_t>(1, (1 << 20) / (k * 2 * kPanel * panels_per_unit));
  // Blocks [b0, b1) (b0 even) against units [begin, end), on this thread.
  auto run = [&](int64_t b0, int64_t b1, int64_t begin, int64_t end) {
    Pipe pipe;
    with_tiles<true>([&] {
      for (int64_t c0 = b0; c0 < b1; c0 += chunk) {
        const int64_t c1 = std::min(b1, c0 + chunk);
        for (int64_t u0 = begin; u0 < end; u0 += group)
          for (int64_t i = c0; i < c1; i += 2) {
            const bool two = i + 1 < c1;
            const int rows = blocks[i].rows + (two ? blocks[i + 1].rows : 0);
            const int64_t u1 = std::min(end, u0 + group);
            // The first group meets each row pair first: it fetches the next.
            RowPrefetch ahead;
            const bool fetch = u0 == begin && i + 2 < b1;
            if (fetch) {
              for (int h = 0; h < 2 && i + 2 + h < b1; ++h) {
                ahead.base[h] = reinterpret_cast<const char*>(blocks[i + 2 + h].x);
                ahead.lines[h] = (blocks[i + 2 + h].rows * k * 2 + 63) / 64;
              }
              const int64_t steps = (u1 - u0) * panels_per_unit * (k / 32);
              ahead.per_step = static_cast<int>((ahead.lines[0] + ahead.lines[1] + steps - 1) / steps);
            }
            for (int64_t u = u0; u < u1; ++u)
              unit(u, blocks[i].first_row, rows, &pipe,
                   [&](const uint16_t* panel, const float* b, uint16_t* o, int64_t ldo) {
                     RowPrefetch* a = fetch ? &ahead : nullptr;
                     if (two)
                       amx_panel_block<2>(&blocks[i], k, panel, b, o, ldo, &pipe, i == c0, a);
                     else
                       amx_panel_block<1>(&blocks[i], k, panel, b, o, ldo, &pipe, i == c0, a);
                   });
          }
      }
      pipe.finish();
    });
  };
  // The threads split the units, so each reads all of x from L3 and half the
  // weight; where the whole weight fits in L2 beside a chunk, they split the rows
  // instead (each reads half of x and all of the weight, once). SmolLM2 at 4096
  // rows on an AMX Xeon (family 6 model 167), medians of 24 calls in two runs:
  // qkv (1.1 MB) 2.01-2.13 -> 1.62-1.74 ms, o (0.66 MB) 1.02-1.07 -> 0.87; by
  // rows gate/up (3.5 MB) took 0.96-0.99x the time (within the host's noise) and
  // down (1.8 MB, K = 1536: its weight re-read per chunk) 1.05-1.09x, so weights
  // past 1.25 MB keep the units.
  const int64_t threads = at::get_num_threads();
  if (units * panels_per_unit * kPanel * k * 2 <= kRowSplitWeightBytes && nb >= 8 * threads) {
    // Even block boundaries, so row pairs stay whole.
    auto first_block = [&](int64_t t) { return t == threads ? nb : nb * t / threads / 2 * 2; };
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) run(first_block(t), first_block(t + 1), 0, units);
    });
    return;
  }
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) { run(0, nb, begin, end); });
}

}  // namespace pagoda_amx
#endif  // PAGODA_AMX
