// The float32 flash tile: the prefill kernel's and the cascade prefix kernel's
// tile (flash_tile.h) for float32 queries, on any x86 build (AVX-512, AVX2, plain),
// over a float32 cache or a bf16/half one (kv_half.h).
//
// A tile is kF32TileRows (16) query rows of one head: one native vector (AVX-512)
// or two (AVX2) hold one key's scores for all of them, so the online softmax is
// lane-wise, as in the bf16 tile. K and V rows are read in place from
// the paged cache (no packing: float32 rows are already what the FMAs take), 16
// keys per softmax step. A half cache's context is widened into float32 rows
// first, once per (sequence, KV head) a thread meets (WidenedContext). Masked
// keys (causal edge, sliding window, the padding past the context) only occur in
// the chunks at a tile's edges; those are masked lane by lane in scalar code, and
// the rest run unmasked.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kv_half.h"
#include "vec16.h"  // and immintrin.h

namespace {

constexpr int kF32Keys = 16;  // keys per softmax step
constexpr int kF32MaxDim = 256;
constexpr float kMaskedScore = -1e30f;  // finite, so no inf - inf

// Where one (sequence, kv head)'s keys are: a block table over a
// [num_blocks, block_size, num_kv_heads, head_dim] cache of cache_t (float32,
// bf16 or half).
template <typename cache_t>
struct F32Context {
  const cache_t* k_cache;
  const cache_t* v_cache;
  const int32_t* table;
  int64_t len, kv_head, block_size, num_kv_heads, head_dim;
};

// A half cache's (sequence, KV head) context as float32 rows [len][head_dim], which
// the tiles read as a float32 cache of one block. Widened 16 keys at a time inside
// each tile instead, every key was widened once per 16 query rows: a prefill
// step's attention took 1.065x the float32 cache's time (emulated AVX2, Zen 4);
// here once per thread per context. One per thread per call: `id` names the
// context within the call (a sequence and KV head), and the rows stay while it
// is the same; they live in the thread's buffer, kept between calls (a fresh
// multi-MB one per layer would fault its pages in every time). A float32 cache's
// context is read in place.
class WidenedContext {
 public:
  const F32Context<float>& get(const F32Context<float>& ctx, int64_t) { return ctx; }

  template <typename cache_t>
  F32Context<float> get(const F32Context<cache_t>& ctx, int64_t id) {
    const int64_t d = ctx.head_dim;
    if (id != id_ || ctx.len != len_) {
      const size_t size = static_cast<size_t>(2 * std::max<int64_t>(ctx.len, 1) * d);
      if (storage_.size() < size) storage_.resize(size);
      float* k = storage_.data();
      float* v = k + ctx.len * d;
      for (int64_t t = 0; t < ctx.len; ++t) {
        const int64_t at =
            (static_cast<int64_t>(ctx.table[t / ctx.block_size]) * ctx.block_size + t % ctx.block_size) *
                ctx.num_kv_heads * d +
            ctx.kv_head * d;
        widen_row(ctx.k_cache + at, d, k + t * d);
        widen_row(ctx.v_cache + at, d, v + t * d);
      }
      id_ = id, len_ = ctx.len;
    }
    static const int32_t first_block = 0;
    const float* k = storage_.data();
    return {k, k + len_ * d, &first_block, len_, 0, std::max<int64_t>(len_, 1), 1, d};
  }

 private:
  static inline thread_local std::vector<float> storage_;  // K rows, then V rows
  int64_t id_ = -1, len_ = -1;
};

// Query rows per tile: kF32Vecs native vectors per key (2 with AVX2's 8 lanes,
// 1 with AVX-512's 16). With 8 rows a tile, each key or value element broadcast
// from the cache fed one FMA, a load per FMA; with two vectors of rows it feeds
// two (AVX2 on a Zen 4, bench/kernel_ab.py prefill-f32: see ARCHITECTURE).
constexpr int kF32TileRows = 16;
constexpr int kF32Vecs = kF32TileRows / kNativeLanes;
static_assert(kF32Vecs >= 1 && kF32Vecs * kNativeLanes == kF32TileRows);

#ifdef PAGODA_AVX2_HALVES  // vnative is 8 floats
// The 8 x 8 transpose of r: lane j of r[i] -> lane i of r[j].
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
#define PAGODA_F32_TRANSPOSE8 1
#endif

// Up to kF32TileRows query rows of one head, row i at position first_pos + i *
// row_step (0: all at one position, as over a cascade's prefix); out rows
// normalised, and with `lse` each row's log-sum-exp of scaled scores. Row i is
// lane i % kNativeLanes of vector i / kNativeLanes.
void attend_tile_f32(const float* q, int64_t q_stride, int rows, int64_t first_pos, int row_step,
                     const F32Context<float>& ctx, float scale, int64_t window, float* out, int64_t out_stride,
                     float* lse = nullptr) {
  constexpr int W = kNativeLanes, V = kF32Vecs;
  static_assert(kF32Keys == 16, "the score groups below split 16 keys");
  const int64_t d = ctx.head_dim;
  alignas(64) static thread_local float zero_row[kF32MaxDim];  // padding keys read this
  vnative qt[kF32MaxDim][V];  // Q^T: V vectors of rows per dim, scaled
  vnative ot[kF32MaxDim][V];  // O^T
  // Q^T and O^T go in and out through 8 x 8 transposes with AVX2: element by
  // element they were ~8% of a 1024-token prefill's tile time (emulated AVX2 on
  // a Zen 4, perf). The same products (q * scale, o * 1 / l), so the same bits.
#ifdef PAGODA_F32_TRANSPOSE8
  const bool transposed = d % 8 == 0;
#else
  constexpr bool transposed = false;
#endif
  if (transposed) {
#ifdef PAGODA_F32_TRANSPOSE8
    const __m256 scale_v = _mm256_set1_ps(scale);
    for (int h = 0; h < V; ++h)
      for (int64_t e0 = 0; e0 < d; e0 += 8) {
        __m256 r[8];
        for (int n = 0; n < 8; ++n)
          r[n] = h * W + n < rows ? _mm256_mul_ps(_mm256_loadu_ps(q + (h * W + n) * q_stride + e0), scale_v)
                                  : _mm256_setzero_ps();
        transpose8(r);
        for (int i = 0; i < 8; ++i) qt[e0 + i][h] = (vnative)r[i], ot[e0 + i][h] = vnative{};
      }
#endif
  } else {
    for (int64_t e = 0; e < d; ++e)
      for (int h = 0; h < V; ++h) {
        float lanes[W] = {};
        for (int n = 0; n < W && h * W + n < rows; ++n) lanes[n] = q[(h * W + n) * q_stride + e] * scale;
        std::memcpy(&qt[e][h], lanes, sizeof(lanes));
        ot[e][h] = vnative{};
      }
  }
  vnative m[V], l[V];
  for (int h = 0; h < V; ++h) m[h] = vnative{} + kMaskedScore, l[h] = vnative{};
  const int64_t last_pos = first_pos + static_cast<int64_t>(rows - 1) * row_step;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  for (int64_t k0 = lo / kF32Keys * kF32Keys; k0 <= last_pos; k0 += kF32Keys) {
    // The 16 keys' rows, walking the block table: one division per step, not
    // two per key (0.98x the tile's time on a Zen 3, kernel_ab prefill-f32).
    const float* krow[kF32Keys];
    const float* vrow[kF32Keys];
    int64_t block = k0 / ctx.block_size, slot = k0 - block * ctx.block_size;
    for (int j = 0; j < kF32Keys; ++j, ++slot) {
      if (slot == ctx.block_size) slot = 0, ++block;
      const bool real = k0 + j < ctx.len;
      const int64_t at = (static_cast<int64_t>(ctx.table[real ? block : 0]) * ctx.block_size + slot) *
                             ctx.num_kv_heads * ctx.head_dim +
                         ctx.kv_head * ctx.head_dim;
      krow[j] = real ? ctx.k_cache + at : zero_row;
      vrow[j] = real ? ctx.v_cache + at : zero_row;
    }
    // Scores: each key element broadcast once against the V query vectors of
    // its dim, G keys at a time: G x V independent FMA chains. With AVX2 (V = 2)
    // groups of 6, 6 and 4 keys: 12 chains, against two FMA units x 4 cycles of
    // latency, where 8 (groups of 4) left no slack for a load's latency (and
    // fewer, ~40% of the float32 peak on a Zen 3); AVX-512, 8 keys at a time.
    // Each score sums over the dims in the same order in any group.
    vnative x[kF32Keys][V];
    auto score_keys = [&](auto group, int j0) {
      constexpr int G = decltype(group)::value;
      vnative a[G][V] = {};
      for (int64_t e = 0; e < d; ++e) {
#pragma GCC unroll 8
        for (int jj = 0; jj < G; ++jj) {
          const float kv = krow[j0 + jj][e];
#pragma GCC unroll 2
          for (int h = 0; h < V; ++h) a[jj][h] += kv * qt[e][h];
        }
      }
      for (int jj = 0; jj < G; ++jj)
        for (int h = 0; h < V; ++h) x[j0 + jj][h] = a[jj][h];
    };
    if constexpr (V == 2) {
      score_keys(std::integral_constant<int, 6>{}, 0);
      score_keys(std::integral_constant<int, 6>{}, 6);
      score_keys(std::integral_constant<int, 4>{}, 12);
    } else {
      for (int j0 = 0; j0 < kF32Keys; j0 += 8 / V) score_keys(std::integral_constant<int, 8 / V>{}, j0);
    }
    const bool masked = k0 + kF32Keys - 1 > first_pos || (window > 0 && last_pos - k0 >= window);
    bool drop[kF32Keys][kF32TileRows];
    if (masked)
      for (int j = 0; j < kF32Keys; ++j)
        for (int n = 0; n < kF32TileRows; ++n) {
          const int64_t kp = k0 + j, qp = first_pos + static_cast<int64_t>(n) * row_step;
          drop[j][n] = kp > qp || (window > 0 && qp - kp >= window);
          if (drop[j][n]) x[j][n / W][n % W] = kMaskedScore;
        }
    vnative alpha[V], p[kF32Keys][V];
    for (int h = 0; h < V; ++h) {
      vnative mx = m[h];
      for (int j = 0; j < kF32Keys; ++j) mx = vmax(mx, x[j][h]);
      alpha[h] = exp_native(m[h] - mx);
      m[h] = mx;
      vnative sum{};
      for (int j = 0; j < kF32Keys; ++j) {
        p[j][h] = exp_native(x[j][h] - mx);
        if (masked)
          for (int n = 0; n < W; ++n)
            if (drop[j][h * W + n]) p[j][h][n] = 0.f;
        sum += p[j][h];
      }
      l[h] = l[h] * alpha[h] + sum;
    }
    // O^T = alpha O^T + V^T P^T, G dims at a time over the 16 keys: each value
    // element broadcast once against the V vectors of P. With AVX2 6 dims (12
    // chains), then 4 and 2 for the rest of the head (head_dim % 8 == 0).
    auto pv_dims = [&](auto group, int64_t e0) {
      constexpr int G = decltype(group)::value;
      vnative acc[G][V];
      for (int i = 0; i < G; ++i)
        for (int h = 0; h < V; ++h) acc[i][h] = ot[e0 + i][h] * alpha[h];
      for (int j = 0; j < kF32Keys; ++j) {
        const float* v = vrow[j] + e0;
#pragma GCC unroll 8
        for (int i = 0; i < G; ++i) {
          const float vi = v[i];
#pragma GCC unroll 2
          for (int h = 0; h < V; ++h) acc[i][h] += vi * p[j][h];
        }
      }
      for (int i = 0; i < G; ++i)
        for (int h = 0; h < V; ++h) ot[e0 + i][h] = acc[i][h];
    };
    int64_t e0 = 0;
    if constexpr (V == 2) {
      for (; e0 + 6 <= d; e0 += 6) pv_dims(std::integral_constant<int, 6>{}, e0);
      if (e0 + 4 <= d) pv_dims(std::integral_constant<int, 4>{}, e0), e0 += 4;
      if (e0 + 2 <= d) pv_dims(std::integral_constant<int, 2>{}, e0), e0 += 2;
    } else {
      for (; e0 < d; e0 += 8 / V) pv_dims(std::integral_constant<int, 8 / V>{}, e0);
    }
  }
  for (int h = 0; h < V; ++h) {
    float inv[W], mm[W], ll[W];
    std::memcpy(mm, &m[h], sizeof(mm));
    std::memcpy(ll, &l[h], sizeof(ll));
    for (int n = 0; n < W; ++n) inv[n] = 1.f / ll[n];
#ifdef PAGODA_F32_TRANSPOSE8
    if (transposed)
      for (int64_t e0 = 0; e0 < d; e0 += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = (__m256)ot[e0 + i][h];
        transpose8(r);  // r[n]: dims e0.. e0 + 7 of row h * W + n
        for (int n = 0; n < W && h * W + n < rows; ++n)
          _mm256_storeu_ps(out + (h * W + n) * out_stride + e0, _mm256_mul_ps(r[n], _mm256_set1_ps(inv[n])));
      }
#endif
    for (int n = 0; n < W && h * W + n < rows; ++n) {
      const int r = h * W + n;
      if (!transposed)
        for (int64_t e = 0; e < d; ++e) out[r * out_stride + e] = ot[e][h][n] * inv[n];
      if (lse != nullptr) lse[r] = mm[n] + std::log(ll[n]);
    }
  }
}

}  // namespace
