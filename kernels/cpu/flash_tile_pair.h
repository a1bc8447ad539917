// Two flash tiles at once on CPUs with AVX512-BF16 but no AMX (included by
// paged_attention_prefill.cpp and cascade_prefix.cpp after flash_tile.h's tile).
//
// flash_tile.h's vdpbf16ps loops broadcast one K (or V) bf16 pair from the
// packed context per vdpbf16ps against 16 queries. Here 32 queries (two tiles)
// go through each chunk together, so each broadcast pair feeds two: the same
// products in the same order per tile, and each tile's softmax and output are
// attend_tile's (TileSoftmax), so the results are attend_tile's bit for bit.
// Zen 4 (family 25 model 17), bench/kernel_ab.py new/old medians: cascade
// 0.93-0.95x, prefill (4 x 1024) 0.92-0.97x; the products already ran at ~95%
// of the dpbf16 peak there, the softmax around them is most of the rest.
#pragma once

#include "flash_block_amx.h"
#include "flash_tile.h"

namespace {

#ifdef PAGODA_PREFILL

// The pair path without AMX (attend_tile_pair): two tiles' S^T for one chunk,
// 8 keys at a time in 2 x 8 accumulators, so each key pair broadcast from the
// packed context feeds both tiles' queries; the same sums in the same order as
// scores_avx512, per tile.
inline void scores_avx512_pair(const uint32_t* qt0, const uint32_t* qt1, const uint16_t* kc, int64_t d, float* st0,
                               float* st1) {
  const int64_t pairs = d / 2;
  for (int j0 = 0; j0 < kChunk; j0 += 8) {
    const auto* k32 = reinterpret_cast<const uint32_t*>(kc + j0 * d);
    __m512 a0[8], a1[8];
    for (int i = 0; i < 8; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    for (int64_t r = 0; r < pairs; ++r) {
      const __m512bh q0 = (__m512bh)_mm512_load_si512(qt0 + r * kTileRows);
      const __m512bh q1 = (__m512bh)_mm512_load_si512(qt1 + r * kTileRows);
      for (int i = 0; i < 8; ++i) {
        const __m512bh k = bf16_pair(k32 + i * pairs + r);
        a0[i] = _mm512_dpbf16_ps(a0[i], k, q0);
        a1[i] = _mm512_dpbf16_ps(a1[i], k, q1);
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_store_ps(st0 + (j0 + i) * kTileRows, a0[i]);
      _mm512_store_ps(st1 + (j0 + i) * kTileRows, a1[i]);
    }
  }
}

// values_avx512 for two tiles: each value pair broadcast once for both tiles'
// P^T rows (loaded per key pair: 16 + 3 registers instead of 16 of P^T).
inline void values_avx512_pair(const uint16_t* vc, const uint32_t* pt0, const uint32_t* pt1, int64_t d,
                               __m512 alpha0, __m512 alpha1, float* ot0, float* ot1) {
  const auto* v32 = reinterpret_cast<const uint32_t*>(vc);
  for (int64_t e0 = 0; e0 < d; e0 += 8) {
    __m512 a0[8], a1[8];
    for (int i = 0; i < 8; ++i) {
      a0[i] = _mm512_mul_ps(_mm512_load_ps(ot0 + (e0 + i) * kTileRows), alpha0);
      a1[i] = _mm512_mul_ps(_mm512_load_ps(ot1 + (e0 + i) * kTileRows), alpha1);
    }
    for (int j = 0; j < kChunk / 2; ++j) {
      const __m512bh p0 = (__m512bh)_mm512_load_si512(pt0 + j * kTileRows);
      const __m512bh p1 = (__m512bh)_mm512_load_si512(pt1 + j * kTileRows);
      for (int i = 0; i < 8; ++i) {
        const __m512bh v = bf16_pair(v32 + (e0 + i) * (kChunk / 2) + j);
        a0[i] = _mm512_dpbf16_ps(a0[i], v, p0);
        a1[i] = _mm512_dpbf16_ps(a1[i], v, p1);
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_store_ps(ot0 + (e0 + i) * kTileRows, a0[i]);
      _mm512_store_ps(ot1 + (e0 + i) * kTileRows, a1[i]);
    }
  }
}

// Rows a call of attend_rows takes at once: two tiles with AMX (attend_pair_amx)
// or on the AVX512-BF16 path without a window (attend_tile_pair), one otherwise.
inline int tile_rows(bool amx, int64_t window) { return amx || window <= 0 ? 2 * kTileRows : kTileRows; }

// Two tiles (17-32 rows, no window) without AMX: both tiles' products in one
// pass over each chunk's K and V (scores_avx512_pair, values_avx512_pair), each
// broadcast pair feeding two vdpbf16ps instead of one; the tiles' softmax,
// masking and output are attend_tile's, and a chunk past the first tile's last
// row (all masked for it) takes the second tile alone, so each tile's result is
// attend_tile's bit for bit.
template <typename OutT>
void attend_tile_pair(const uint16_t* q, int64_t q_stride, int rows, int64_t first_pos, int row_step,
                      const uint16_t* k_packed, const uint16_t* v_packed, const Layout& lay, float scale,
                      OutT* out, int64_t out_stride, float* lse = nullptr) {
  const int64_t d = lay.head_dim;
  alignas(64) uint32_t qt[2][256 / 32 * 256];
  alignas(64) float st[2][kChunk * kTileRows];
  alignas(64) uint32_t pt[2][kChunk / 2 * kTileRows];
  alignas(64) float ot[2][256 * kTileRows];
  const int n1 = rows - kTileRows;  // rows of the second tile
  const int64_t first1 = first_pos + static_cast<int64_t>(kTileRows) * row_step;
  load_qt(q, q_stride, kTileRows, d, qt[0]);
  load_qt(q + kTileRows * q_stride, q_stride, n1, d, qt[1]);
  std::fill(ot[0], ot[0] + d * kTileRows, 0.f);
  std::fill(ot[1], ot[1] + d * kTileRows, 0.f);
  TileSoftmax sm[2] = {TileSoftmax(first_pos, row_step, scale), TileSoftmax(first1, row_step, scale)};
  const int64_t last0 = first_pos + static_cast<int64_t>(kTileRows - 1) * row_step;
  const int64_t last1 = first1 + static_cast<int64_t>(n1 - 1) * row_step;
  for (int64_t ch = 0; ch <= last1 / kChunk; ++ch) {
    const uint16_t* kc = k_packed + ch * lay.chunk_elems;
    const uint16_t* vc = v_packed + ch * lay.chunk_elems;
    const int64_t k0 = ch * kChunk;
    const bool both = ch <= last0 / kChunk;
    if (both)
      scores_avx512_pair(qt[0], qt[1], kc, d, st[0], st[1]);
    else
      scores_avx512(qt[1], kc, d, st[1]);
    __m512 alpha[2];
    bool shifted;
    for (int t = both ? 0 : 1; t < 2; ++t)
      alpha[t] = sm[t].chunk(st[t], k0, k0 + kChunk - 1 > (t == 0 ? first_pos : first1), 0, false, pt[t], shifted);
    if (both)
      values_avx512_pair(vc, pt[0], pt[1], d, alpha[0], alpha[1], ot[0], ot[1]);
    else
      values_avx512(vc, pt[1], d, alpha[1], ot[1]);
  }
  sm[0].finish(ot[0], kTileRows, d, out, out_stride, lse);
  sm[1].finish(ot[1], n1, d, out + kTileRows * out_stride, out_stride, lse != nullptr ? lse + kTileRows : nullptr);
}

// Up to tile_rows(amx, window) query rows: attend_pair_amx for 17-32 rows with
// AMX, attend_tile_pair for them without AMX or a window, attend_tile otherwise.
template <bool kAmx, typename OutT>
void attend_rows(const uint16_t* q, int64_t q_stride, int rows, int64_t first_pos, int row_step,
                 const uint16_t* k_packed, const uint16_t* v_packed, const Layout& lay, float scale,
                 int64_t window, OutT* out, int64_t out_stride, float* lse = nullptr) {
#ifdef PAGODA_AMX
  if (kAmx && rows > kTileRows)
    return attend_pair_amx(q, q_stride, rows, first_pos, row_step, k_packed, v_packed, lay, scale, window, out,
                           out_stride, lse);
#endif
  if (!kAmx && window <= 0 && rows > kTileRows)
    return attend_tile_pair(q, q_stride, rows, first_pos, row_step, k_packed, v_packed, lay, scale, out,
                            out_stride, lse);
  attend_tile<kAmx>(q, q_stride, rows, first_pos, row_step, k_packed, v_packed, lay, scale, window, out, out_stride,
                    lse);
}

#endif  // PAGODA_PREFILL

}  // namespace
