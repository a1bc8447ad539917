// The float32 flash tile: the prefill kernel's and the cascade prefix kernel's
// tile (flash_tile.h) for float32 caches, on any x86 build (AVX-512, AVX2, plain).
//
// A tile is kNativeLanes query rows of one head (16 with AVX-512, 8 with AVX2):
// one native vector holds one key's scores for all of them, so the online
// softmax is lane-wise, as in the bf16 tile. K and V rows are read in place from
// the paged cache (no packing: float32 rows are already what the FMAs take), 16
// keys per softmax step. Masked keys (causal edge, sliding window, the padding
// past the context) only occur in the chunks at a tile's edges; those are
// masked lane by lane in scalar code, and the rest run unmasked.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "vec16.h"

namespace {

constexpr int kF32Keys = 16;  // keys per softmax step
constexpr int kF32MaxDim = 256;
constexpr float kMaskedScore = -1e30f;  // finite, so no inf - inf

// Where one (sequence, kv head)'s keys are: a block table over a
// [num_blocks, block_size, num_kv_heads, head_dim] float32 cache.
struct F32Context {
  const float* k_cache;
  const float* v_cache;
  const int32_t* table;
  int64_t len, kv_head, block_size, num_kv_heads, head_dim;
};

// Up to kNativeLanes query rows of one head, row i at position first_pos + i *
// row_step (0: all at one position, as over a cascade's prefix); out rows
// normalised, and with `lse` each row's log-sum-exp of scaled scores.
void attend_tile_f32(const float* q, int64_t q_stride, int rows, int64_t first_pos, int row_step,
                     const F32Context& ctx, float scale, int64_t window, float* out, int64_t out_stride,
                     float* lse = nullptr) {
  constexpr int W = kNativeLanes;
  const int64_t d = ctx.head_dim;
  alignas(64) static thread_local float zero_row[kF32MaxDim];  // padding keys read this
  vnative qt[kF32MaxDim];  // Q^T: one vector per dim, scaled
  vnative ot[kF32MaxDim];  // O^T
  for (int64_t e = 0; e < d; ++e) {
    float lanes[W] = {};
    for (int n = 0; n < rows; ++n) lanes[n] = q[n * q_stride + e] * scale;
    std::memcpy(&qt[e], lanes, sizeof(lanes));
    ot[e] = vnative{};
  }
  vnative m = vnative{} + kMaskedScore, l = vnative{};
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
    // Scores, 8 keys at a time against each dim's query vector: 8 independent
    // FMA chains (two FMA units x 4 cycles of latency), where 4 left half of
    // an AVX2 core's FMA slots empty (the tile ran at ~40% of the float32 peak
    // on a Zen 3: bench/kernel_ab.py prefill-f32).
    vnative x[kF32Keys];
    for (int j0 = 0; j0 < kF32Keys; j0 += 8) {
      vnative a0{}, a1{}, a2{}, a3{}, a4{}, a5{}, a6{}, a7{};
      const float *k0r = krow[j0], *k1r = krow[j0 + 1], *k2r = krow[j0 + 2], *k3r = krow[j0 + 3];
      const float *k4r = krow[j0 + 4], *k5r = krow[j0 + 5], *k6r = krow[j0 + 6], *k7r = krow[j0 + 7];
      for (int64_t e = 0; e < d; ++e) {
        const vnative qv = qt[e];
        a0 += k0r[e] * qv;
        a1 += k1r[e] * qv;
        a2 += k2r[e] * qv;
        a3 += k3r[e] * qv;
        a4 += k4r[e] * qv;
        a5 += k5r[e] * qv;
        a6 += k6r[e] * qv;
        a7 += k7r[e] * qv;
      }
      x[j0] = a0, x[j0 + 1] = a1, x[j0 + 2] = a2, x[j0 + 3] = a3;
      x[j0 + 4] = a4, x[j0 + 5] = a5, x[j0 + 6] = a6, x[j0 + 7] = a7;
    }
    const bool masked = k0 + kF32Keys - 1 > first_pos || (window > 0 && last_pos - k0 >= window);
    bool drop[kF32Keys][W];
    if (masked)
      for (int j = 0; j < kF32Keys; ++j)
        for (int n = 0; n < W; ++n) {
          const int64_t kp = k0 + j, qp = first_pos + static_cast<int64_t>(n) * row_step;
          drop[j][n] = kp > qp || (window > 0 && qp - kp >= window);
          if (drop[j][n]) x[j][n] = kMaskedScore;
        }
    vnative mx = m;
    for (int j = 0; j < kF32Keys; ++j) mx = vmax(mx, x[j]);
    const vnative alpha = exp_native(m - mx);
    m = mx;
    vnative p[kF32Keys];
    vnative sum{};
    for (int j = 0; j < kF32Keys; ++j) {
      p[j] = exp_native(x[j] - mx);
      if (masked)
        for (int n = 0; n < W; ++n)
          if (drop[j][n]) p[j][n] = 0.f;
      sum += p[j];
    }
    l = l * alpha + sum;
    // O^T = alpha O^T + V^T P^T, 8 dims at a time over the 16 keys.
    for (int64_t e0 = 0; e0 < d; e0 += 8) {
      vnative acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = ot[e0 + i] * alpha;
      for (int j = 0; j < kF32Keys; ++j) {
        const vnative pj = p[j];
        const float* v = vrow[j] + e0;
        for (int i = 0; i < 8; ++i) acc[i] += v[i] * pj;
      }
      for (int i = 0; i < 8; ++i) ot[e0 + i] = acc[i];
    }
  }
  float inv[W], mm[W], ll[W];
  std::memcpy(mm, &m, sizeof(mm));
  std::memcpy(ll, &l, sizeof(ll));
  for (int n = 0; n < W; ++n) inv[n] = 1.f / ll[n];
  for (int n = 0; n < rows; ++n) {
    for (int64_t e = 0; e < d; ++e) out[n * out_stride + e] = ot[e][n] * inv[n];
    if (lse != nullptr) lse[n] = mm[n] + std::log(ll[n]);
  }
}

}  // namespace
