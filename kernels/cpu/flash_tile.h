// Flash-attention tiles for bf16 CPUs with native bf16 products (AMX, or
// AVX512-BF16 without it), shared by the prefill kernel and the cascade's
// shared-prefix kernel: the packed context layout, and one tile of 16 query rows
// attending to a packed context with an online softmax.
//
// Per 16 query rows and 32 keys: S^T = K Q^T (one register = one key's scores for
// the 16 queries), softmax update lane-wise in AVX-512, O^T = alpha O^T + V^T P^T
// (P in bf16). With AMX the two products are tile products; with AVX512-BF16
// each is a register-blocked loop of vdpbf16ps, a key's (or a dim's) bf16 pair
// broadcast against 16 queries' pairs. Both read the same packed layouts.
// Without AMX, callers go through flash_tile_pair.h's attend_rows, which runs two
// tiles through each chunk together.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "vec16.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define PAGODA_PREFILL 1
#endif

namespace {

constexpr int kChunk = 32;      // keys per softmax step: two 16-key tiles
constexpr int kTileRows = 16;   // query rows per tile

#ifdef PAGODA_PREFILL

// A reused buffer whose data starts on a cache line. The packed K and V are
// read as 64-byte tile rows, and malloc aligns to 16 bytes only (an mmap'd
// block's data starts 16 bytes past a page), so where a vector landed decided
// whether every row straddled two lines: the prefill kernel (4 x 1024 tokens,
// one layer, AMX Xeon family 6 model 167), the same build with the buffers on a
// line or 16 bytes past one, 50 alternating calls: 6.36 vs 7.70 ms.
struct LineBuffer {
  std::vector<uint16_t> store;
  uint16_t* get(size_t elems) {
    if (store.size() < elems + 32) store.resize(elems + 32);
    return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
  }
};

struct Layout {
  int64_t head_dim, num_heads, num_kv_heads, block_size;
  int64_t chunk_elems;  // packed bf16 per 32-key chunk, of K and of V each
};

// In-register transpose of 16 rows of 16 words: r[j] lane e -> r[e] lane j.
// Four rounds of 16 shuffles: 32-bit and 64-bit interleaves within 128-bit lanes
// (b[4i + m] lane L then holds rows 4i..4i+3 of column 4L + m), then a 4 x 4
// transpose of 128-bit lanes per m.
inline void transpose_16x16_words(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i x0 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0x44), x1 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0xEE);
    r[m] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    r[4 + m] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    r[8 + m] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
}

// Pack chunks [c0, c1) of one (sequence, kv head)'s first `len` keys, zero past
// len: K rows contiguous ([chunk][32 keys][head_dim], an A tile of 16 keys x 32
// dims at a row stride of head_dim), V transposed ([chunk][head_dim / 16][16
// dims][32 keys], an A tile of 16 dims x 32 keys). head_dim is a multiple of 64.
// Per 16 dims, the 16 key pairs' (key 2j, key 2j + 1) words are transposed in
// registers into the 16 dims' rows: vpscatterdd stores did the same and were 88%
// of a cascade's packing on a Zen 4 (512 prefix tokens, 3 KV heads: ~50 us).
void pack_context(const uint16_t* k_cache, const uint16_t* v_cache, const int32_t* table, int64_t len,
                  int64_t kv_head, const Layout& lay, uint16_t* k_out, uint16_t* v_out, int64_t c0 = 0,
                  int64_t c1 = -1) {
  const int64_t d = lay.head_dim;
  if (c1 < 0) c1 = (len + kChunk - 1) / kChunk;
  auto offset_of = [&](int64_t p) -> int64_t {  // key p's row of this head in the caches; -1 past len
    if (p >= len) return -1;
    const int64_t slot = static_cast<int64_t>(table[p / lay.block_size]) * lay.block_size + p % lay.block_size;
    return (slot * lay.num_kv_heads + kv_head) * d;
  };
  for (int64_t c = c0; c < c1; ++c) {
    uint16_t* kc = k_out + c * lay.chunk_elems;
    auto* vc = reinterpret_cast<__m512i*>(v_out + c * lay.chunk_elems);  // [dim][16 key pairs] words
    int64_t off[kChunk];
    for (int j = 0; j < kChunk; ++j) off[j] = offset_of(c * kChunk + j);
    for (int j = 0; j < kChunk; ++j)
      for (int64_t e = 0; e < d; e += 32)
        _mm512_storeu_si512(kc + j * d + e,
                            off[j] < 0 ? _mm512_setzero_si512() : _mm512_loadu_si512(k_cache + off[j] + e));
    for (int64_t e = 0; e < d; e += 16) {
      __m512i pairs[16];  // key pair j: 16 dims of (key 2j, key 2j + 1) words
      for (int j = 0; j < kChunk / 2; ++j) {
        __m512i pair = _mm512_setzero_si512();
        for (int i = 0; i < 2; ++i)
          if (off[2 * j + i] >= 0) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v_cache + off[2 * j + i] + e));
            pair = _mm512_or_si512(pair, _mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16 * i));
          }
        pairs[j] = pair;
      }
      transpose_16x16_words(pairs);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(vc + e + i, pairs[i]);
    }
  }
}

// 2^x for x <= 0: 2^floor(x) * p(f), f = x - floor(x) in [0, 1) from one
// vreduceps, p a degree-3 least-squares fit of 2^f on Chebyshev nodes (relative
// error under 8e-5: 50 times finer than the bf16 rounding the probabilities
// take next, and alpha's error cancels, as O^T and l both take it), and
// vscalefps multiplies by 2^floor(x) itself: 5 instructions where a degree-4
// fit around round, subtract and scale by the rounded value took 8 uops (the
// softmax is most of a prefill tile's vector work; degree 4 on [0, 1): 1.03x
// the time of degree 3 for the AMX prefill kernel, 4 x 1024 tokens). Finite x
// only: scalef takes floor(x) below -126 to 0 on its own. kClamp first clamps at
// -126, so -inf (a masked score) gives a tiny positive for the caller to zero.
template <bool kClamp>
inline __m512 exp2_nonpositive(__m512 x) {
  if constexpr (kClamp) x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(7.7907163774e-02f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2623319420e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9577709643e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9992782664e-01f));
  return _mm512_scalef_ps(p, x);
}

#ifdef PAGODA_AMX
// S^T for one chunk as two 16x16 fp32 tiles: st [32 keys][16 queries].
inline void scores_amx(const uint32_t* qt, const uint16_t* kc, int64_t d, float* st) {
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t dc = 0; dc < d / 32; ++dc) {
    _tile_loadd(2, qt + dc * 256, 64);
    _tile_loadd(3, kc + dc * 32, d * 2);
    _tile_dpbf16ps(0, 3, 2);
    _tile_loadd(3, kc + 16 * d + dc * 32, d * 2);
    _tile_dpbf16ps(1, 3, 2);
  }
  _tile_stored(0, st, 64);
  _tile_stored(1, st + 16 * kTileRows, 64);
}

// Tiles 4-7 (64 dims of O^T) += V^T P^T for one chunk: tmm2 holds P^T.
inline void accumulate_pv(const uint16_t* v_tiles) {
  _tile_loadd(3, v_tiles + 0 * 512, 64);
  _tile_dpbf16ps(4, 3, 2);
  _tile_loadd(3, v_tiles + 1 * 512, 64);
  _tile_dpbf16ps(5, 3, 2);
  _tile_loadd(3, v_tiles + 2 * 512, 64);
  _tile_dpbf16ps(6, 3, 2);
  _tile_loadd(3, v_tiles + 3 * 512, 64);
  _tile_dpbf16ps(7, 3, 2);
}

inline void zero_tiles_4_7() {
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
}

inline void load_tiles_4_7(const float* in) {
  _tile_loadd(4, in + 0 * 256, 64);
  _tile_loadd(5, in + 1 * 256, 64);
  _tile_loadd(6, in + 2 * 256, 64);
  _tile_loadd(7, in + 3 * 256, 64);
}

inline void store_tiles_4_7(float* out) {
  _tile_stored(4, out + 0 * 256, 64);
  _tile_stored(5, out + 1 * 256, 64);
  _tile_stored(6, out + 2 * 256, 64);
  _tile_stored(7, out + 3 * 256, 64);
}

// Four output tiles (64 dims) of V^T P^T for one chunk, into pv.
inline void pv_group(const uint16_t* v_tiles, float* pv) {
  zero_tiles_4_7();
  accumulate_pv(v_tiles);
  store_tiles_4_7(pv);
}

// ot [d][16 queries] = alpha * ot + V^T P^T, P^T given as a B tile (pt).
inline void values_amx(const uint16_t* vc, const uint32_t* pt, int64_t d, __m512 alpha, float* ot) {
  alignas(64) float pv[256 * kTileRows];
  _tile_loadd(2, pt, 64);
  for (int64_t g = 0; g < d / 64; ++g) pv_group(vc + g * 4 * 512, pv + g * 4 * 256);
  for (int64_t e = 0; e < d; ++e)
    _mm512_store_ps(ot + e * kTileRows,
                    _mm512_fmadd_ps(_mm512_load_ps(ot + e * kTileRows), alpha, _mm512_load_ps(pv + e * kTileRows)));
}

// head_dim 64 only: O^T [64 dims][16 queries] lives in tiles 4-7 for the whole
// tile of queries (scores_amx uses 0-3), so a chunk's V^T P^T accumulates in
// place instead of going through L1 and an AVX-512 rescale: on a 2.5 TFLOP/s
// AMX core those stores, loads and FMAs cost more than the products.
inline void values_amx_resident(const uint16_t* vc, const uint32_t* pt) {
  _tile_loadd(2, pt, 64);
  accumulate_pv(vc);
}

// The resident O^T times alpha (per query), through ot.
inline void rescale_resident(__m512 alpha, float* ot) {
  store_tiles_4_7(ot);
  for (int e = 0; e < 64; ++e) _mm512_store_ps(ot + e * kTileRows, _mm512_mul_ps(_mm512_load_ps(ot + e * kTileRows), alpha));
  load_tiles_4_7(ot);
}
#endif  // PAGODA_AMX

// With O^T resident in tiles, the softmax's shift (m) moves only when a query's
// running max passes it by more than this (log2 units), as FlashAttention-4
// does: probabilities then reach 2^8 at most, exact in fp32 and as relatively
// precise in bf16, and O^T and l stay relative to the same shift, so O = O^T / l
// is unchanged; most chunks of a long prompt then need no rescale at all.
constexpr float kLazyRescale = 8.f;

inline __m512bh bf16_pair(const uint32_t* p) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(*p)); }

// S^T for one chunk without AMX: 16 keys at a time in 16 accumulators, each
// query-pair row of Q^T loaded once per 16 keys; st [32 keys][16 queries].
inline void scores_avx512(const uint32_t* qt, const uint16_t* kc, int64_t d, float* st) {
  const int64_t pairs = d / 2;
  for (int j0 = 0; j0 < kChunk; j0 += 16) {
    const auto* k32 = reinterpret_cast<const uint32_t*>(kc + j0 * d);  // key j0 + i, pair r: k32[i * pairs + r]
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t r = 0; r < pairs; ++r) {
      const __m512bh q = (__m512bh)_mm512_load_si512(qt + r * kTileRows);
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], bf16_pair(k32 + i * pairs + r), q);
    }
    for (int i = 0; i < 16; ++i) _mm512_store_ps(st + (j0 + i) * kTileRows, acc[i]);
  }
}

// ot [d][16 queries] = alpha * ot + V^T P^T without AMX: P^T's 16 key-pair rows
// stay in registers, 8 dims at a time accumulate over them.
inline void values_avx512(const uint16_t* vc, const uint32_t* pt, int64_t d, __m512 alpha, float* ot) {
  __m512bh p[kChunk / 2];
  for (int j = 0; j < kChunk / 2; ++j) p[j] = (__m512bh)_mm512_load_si512(pt + j * kTileRows);
  const auto* v32 = reinterpret_cast<const uint32_t*>(vc);  // dim e, key pair j: v32[e * 16 + j]
  for (int64_t e0 = 0; e0 < d; e0 += 8) {
    __m512 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_mul_ps(_mm512_load_ps(ot + (e0 + i) * kTileRows), alpha);
    for (int j = 0; j < kChunk / 2; ++j)
      for (int i = 0; i < 8; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], bf16_pair(v32 + (e0 + i) * (kChunk / 2) + j), p[j]);
    for (int i = 0; i < 8; ++i) _mm512_store_ps(ot + (e0 + i) * kTileRows, acc[i]);
  }
}

// Q^T of up to 16 query rows as B tiles, [dim chunk][16 dim pairs][16 queries]:
// 16 rows of 16 pair words at a time, transposed in registers (a word at a
// time this was 5% of the tile's time on a Zen 5).
inline void load_qt(const uint16_t* q, int64_t q_stride, int rows, int64_t d, uint32_t* qt) {
  for (int64_t r0 = 0; r0 < d / 2; r0 += 16) {
    __m512i t[kTileRows];
    for (int n = 0; n < kTileRows; ++n)
      t[n] = n < rows ? _mm512_loadu_si512(q + n * q_stride + 2 * r0) : _mm512_setzero_si512();
    transpose_16x16_words(t);
    for (int i = 0; i < 16; ++i) _mm512_store_si512(qt + (r0 + i) * kTileRows, t[i]);
  }
}

// One tile's online softmax: m (its shift) and l per query, in log2 units.
struct TileSoftmax {
  __m512 m, l;
  __m512i q_pos;  // each query's position
  __m512 c;       // the attention scale times log2(e): raw scores to log2 units
  TileSoftmax(int64_t first_pos, int row_step, float scale)
      : m(_mm512_set1_ps(-std::numeric_limits<float>::infinity())),
        l(_mm512_setzero_ps()),
        q_pos(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(first_pos)),
                               _mm512_mullo_epi32(_mm512_set1_epi32(row_step),
                                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                                    14, 15)))),
        c(_mm512_set1_ps(scale * 1.44269504088896341f)) {}

  // A chunk's scores st [32 keys][16 queries] (keys from k0) -> P^T as a B tile
  // (pt) and l updated; returns alpha, the factor O^T takes first. `shifted`
  // says whether m moved (with `lazy`, only past kLazyRescale).
  __m512 chunk(const float* st, int64_t k0, bool masked, int64_t window, bool lazy, uint32_t* pt, bool& shifted) {
    // Raw scores: scale > 0, so max(s c) = c max(s), and each p = 2^(s c - base)
    // takes one FMA for the scaling and the shift.
    __m512 x[kChunk];
    __m512 smax = neg_inf();
    for (int j = 0; j < kChunk; ++j) {
      x[j] = _mm512_load_ps(st + j * kTileRows);
      if (masked) x[j] = mask_key(x[j], k0 + j, window);
      smax = _mm512_max_ps(smax, x[j]);
    }
    __m512 base;
    const __m512 alpha = shift(smax, lazy, shifted, base);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < kChunk; j += 2) sum = _mm512_add_ps(sum, probs(x[j], x[j + 1], base, masked, pt + (j / 2) * kTileRows));
    l = _mm512_fmadd_ps(l, alpha, sum);
    return alpha;
  }

  // chunk() over `chunks` consecutive chunks at once (st [chunks * 32 keys][16
  // queries] -> pt [chunks][16 key pairs][16 queries]): one max and one shift
  // decision for all of them, the scores read twice from L1 instead of held in
  // registers. `masked` applies the mask to every key of the block.
  __m512 block(const float* st, int chunks, int64_t k0, bool masked, int64_t window, bool lazy, uint32_t* pt,
               bool& shifted) {
    const int keys = chunks * kChunk;
    __m512 mx4[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};  // four chains: max's latency, not its rate
    for (int j = 0; j < keys; j += 4)
      for (int i = 0; i < 4; ++i) {
        __m512 x = _mm512_load_ps(st + (j + i) * kTileRows);
        if (masked) x = mask_key(x, k0 + j + i, window);
        mx4[i] = _mm512_max_ps(mx4[i], x);
      }
    __m512 base;
    const __m512 alpha =
        shift(_mm512_max_ps(_mm512_max_ps(mx4[0], mx4[1]), _mm512_max_ps(mx4[2], mx4[3])), lazy, shifted, base);
    __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int j = 0; j < keys; j += 2) {
      __m512 x0 = _mm512_load_ps(st + j * kTileRows), x1 = _mm512_load_ps(st + (j + 1) * kTileRows);
      if (masked) {
        x0 = mask_key(x0, k0 + j, window);
        x1 = mask_key(x1, k0 + j + 1, window);
      }
      sum[(j / 2) & 1] = _mm512_add_ps(sum[(j / 2) & 1], probs(x0, x1, base, masked, pt + (j / 2) * kTileRows));
    }
    l = _mm512_fmadd_ps(l, alpha, _mm512_add_ps(sum[0], sum[1]));
    return alpha;
  }

 private:
  static __m512 neg_inf() { return _mm512_set1_ps(-std::numeric_limits<float>::infinity()); }

  // -inf where key `key` is past a query's position or, with a window, before its start.
  __m512 mask_key(__m512 x, int64_t key_pos, int64_t window) const {
    const __m512i key = _mm512_set1_epi32(static_cast<int32_t>(key_pos));
    __mmask16 drop = _mm512_cmpgt_epi32_mask(key, q_pos);
    if (window > 0)
      drop |= _mm512_cmpge_epi32_mask(_mm512_sub_epi32(q_pos, key), _mm512_set1_epi32(static_cast<int32_t>(window)));
    return _mm512_mask_blend_ps(drop, x, neg_inf());
  }

  // Moves m for a step whose raw max is smax; returns alpha (O^T's factor) and
  // the shift the step's probabilities take (base).
  __m512 shift(__m512 smax, bool lazy, bool& shifted, __m512& base) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 mx = _mm512_max_ps(m, _mm512_mul_ps(smax, c));
    // Lazy: keep the old shift unless some query's max passed it by more than
    // kLazyRescale (m = -inf and a first key count as passing).
    shifted = !lazy || _mm512_cmp_ps_mask(mx, _mm512_add_ps(m, _mm512_set1_ps(kLazyRescale)), _CMP_GT_OQ) != 0;
    if (!shifted) mx = m;
    // A query with no key yet keeps m = -inf: shift by 0 so nothing becomes NaN.
    const __mmask16 none = _mm512_cmp_ps_mask(mx, neg_inf(), _CMP_EQ_OQ);
    base = _mm512_mask_blend_ps(none, mx, zero);
    // Unshifted, alpha is exactly 1: the polynomial's 2^0 is 1 - 7e-5, and the
    // resident O^T is not multiplied by it.
    const __m512 alpha = !shifted ? _mm512_set1_ps(1.f)
                                  : _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, neg_inf(), _CMP_NEQ_OQ),
                                                        exp2_nonpositive<true>(_mm512_sub_ps(m, base)));
    m = mx;
    return alpha;
  }

  // Keys j and j + 1's probabilities for the 16 queries, stored as one B-tile
  // row of (key j, key j + 1) bf16 pairs at pt_row; returns their sum.
  __m512 probs(__m512 x0, __m512 x1, __m512 base, bool masked, uint32_t* pt_row) const {
    const __m512i pair_words = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 p0, p1;
    if (masked) {
      p0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x0, neg_inf(), _CMP_NEQ_OQ),
                               exp2_nonpositive<true>(_mm512_fmsub_ps(x0, c, base)));
      p1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x1, neg_inf(), _CMP_NEQ_OQ),
                               exp2_nonpositive<true>(_mm512_fmsub_ps(x1, c, base)));
    } else {
      p0 = exp2_nonpositive<false>(_mm512_fmsub_ps(x0, c, base));
      p1 = exp2_nonpositive<false>(_mm512_fmsub_ps(x1, c, base));
    }
    // cvtne2ps puts p0's 16 words below p1's, one word permute interleaves them.
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    _mm512_store_si512(pt_row, _mm512_permutexvar_epi16(pair_words, both));
    return _mm512_add_ps(p0, p1);
  }

 public:
  // O = (O^T / l)^T for `rows` queries, 16 dims at a time through the register
  // transpose; with `lse` each row's log-sum-exp of scaled scores.
  template <typename OutT>
  void finish(const float* ot, int rows, int64_t d, OutT* out, int64_t out_stride, float* lse) const {
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), l);
    for (int64_t e0 = 0; e0 < d; e0 += kLanes) {
      __m512i t[16];
      for (int i = 0; i < 16; ++i)
        t[i] = _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(ot + (e0 + i) * kTileRows), inv));
      transpose_16x16_words(t);  // t[n] lane i: dim e0 + i of query n
      for (int n = 0; n < rows; ++n) {
        vec16 v;
        std::memcpy(&v, &t[n], sizeof(v));
        if constexpr (std::is_same_v<OutT, float>)
          std::memcpy(out + n * out_stride + e0, &v, sizeof(v));
        else
          store_bf16(out + n * out_stride + e0, v);
      }
    }
    if (lse != nullptr) {
      // sum_j e^(scale s_j) = 2^m l, m in log2 units.
      alignas(64) float mm[kTileRows], ll[kTileRows];
      _mm512_store_ps(mm, m);
      _mm512_store_ps(ll, l);
      for (int i = 0; i < rows; ++i) lse[i] = (mm[i] + std::log2(ll[i])) * 0.69314718055994531f;
    }
  }
};

// One tile of up to 16 query rows of one head, row i at position
// first_pos + i * row_step (row_step 0: every row sees the same keys, as the
// decode rows over a cascade's shared prefix do).
// Scores are computed transposed, S^T = K Q^T, so one register holds one key's
// scores for all 16 queries: the softmax's max and sum are lane-wise, with no
// horizontal reductions, and O^T = V^T P^T is rescaled lane-wise too.
// OutT: uint16_t writes bf16 rows; float writes fp32 rows, and with `lse` each
// row's log-sum-exp of scaled scores (lse[i]), for merging with another part.
template <bool kAmx, typename OutT>
void attend_tile(const uint16_t* q, int64_t q_stride, int rows, int64_t first_pos, int row_step,
                 const uint16_t* k_packed, const uint16_t* v_packed, const Layout& lay, float scale,
                 int64_t window, OutT* out, int64_t out_stride, float* lse = nullptr) {
  const int64_t d = lay.head_dim;
  alignas(64) uint32_t qt[256 / 32 * 256];  // Q^T as B tiles: [dim chunk][16 dim pairs][16 queries]
  alignas(64) float st[kChunk * kTileRows];  // S^T: [32 keys][16 queries]
  alignas(64) uint32_t pt[kChunk / 2 * kTileRows];  // P^T as a B tile: [16 key pairs][16 queries]
  alignas(64) float ot[256 * kTileRows];  // O^T
  load_qt(q, q_stride, rows, d, qt);
#ifdef PAGODA_AMX
  const bool resident = kAmx && d == 64;
  if (resident) zero_tiles_4_7();  // ot is written only from the tiles then
  else
#else
  constexpr bool resident = false;
#endif
    std::fill(ot, ot + d * kTileRows, 0.f);
  TileSoftmax sm(first_pos, row_step, scale);
  const int64_t last_pos = first_pos + static_cast<int64_t>(rows - 1) * row_step;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  for (int64_t ch = lo / kChunk; ch <= last_pos / kChunk; ++ch) {
    const uint16_t* kc = k_packed + ch * lay.chunk_elems;
#ifdef PAGODA_AMX
    if constexpr (kAmx) scores_amx(qt, kc, d, st);
    else
#endif
      scores_avx512(qt, kc, d, st);
    const int64_t k0 = ch * kChunk;
    // Only chunks crossing a row's causal edge or window start need a mask.
    const bool masked = k0 + kChunk - 1 > first_pos || (window > 0 && last_pos - k0 >= window);
    bool shifted;
    const __m512 alpha = sm.chunk(st, k0, masked, window, resident, pt, shifted);
#ifdef PAGODA_AMX
    if (resident && shifted) rescale_resident(alpha, ot);
#endif
    const uint16_t* vc = v_packed + ch * lay.chunk_elems;
#ifdef PAGODA_AMX
    if (resident) values_amx_resident(vc, pt);
    else if constexpr (kAmx) values_amx(vc, pt, d, alpha, ot);
    else
#endif
      values_avx512(vc, pt, d, alpha, ot);
  }
#ifdef PAGODA_AMX
  if (resident) store_tiles_4_7(ot);
#endif
  sm.finish(ot, rows, d, out, out_stride, lse);
}

#endif  // PAGODA_PREFILL

}  // namespace
