// The AVX512-BF16 micro-kernel of gemm_bf16.cpp: a block of at most 6 rows of x
// against two 32-column panels at once (64 columns, 24 accumulators), or of at
// most 12 rows against one.
//
// Per pair of k: four panel loads, one broadcast bf16 pair of x per row, four
// vdpbf16ps per row: 10 loads for 24 products, where 12 rows x one panel took 14
// and spilled its 12 row pointers to vector registers. A bare loop on a Zen 4
// core (family 25 model 17, one core, medians of 41 passes, the engine's chunk
// of 108 rows against SmolLM2's weights): 12 x 32 205-216 GFLOP/s, 6 x 64
// 221-234 (the core's vdpbf16ps peak: 232).
//
// Shapes (as gemm_bf16.cpp): panel [K/2][32][2] bf16; x [rows, K] bf16 (row
// stride k); out: rows x (32 * kPanels) bf16 at a row stride of ldo, panel i's
// columns at out + 32 i; bias: 32 float per panel or null.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <cstring>

#ifdef __AVX512BF16__
#include <immintrin.h>

namespace pagoda_dp {

constexpr int kPanel = 32;  // output columns per panel: two 16-lane accumulators
// Rows of a block against kPanels panels: 24 accumulators, with the panel
// registers and a broadcast x within the 32.
template <int kPanels>
constexpr int kMaxRows = 12 / kPanels;

// Lines to prefetch into L2 while a block runs: [0, lines) from at and, with two
// panels, as many from at + second (the other panel of a later unit, which for
// gate/up does not lie beside the first).
struct PanelPrefetch {
  const char* at = nullptr;
  int64_t lines = 0;
  int64_t second = 0;  // bytes
};

// rows x (32 * kPanels) columns of out = x [W_a; W_b]^T (+ bias), over all of K.
// kAhead: prefetch pf (the many-row path has nothing to prefetch, and without
// the code for it the loop keeps its row pointers in registers).
// stream: the output rows go past the caches as whole 64-byte lines (out 64-byte
// aligned, ldo a multiple of 32).
template <int kRows, int kPanels, bool kAhead>
inline void panel_block(const uint16_t* x, int64_t k, const uint16_t* const* panels, const float* const* bias,
                        uint16_t* out, int64_t ldo, const PanelPrefetch& pf, bool stream) {
  static_assert((kPanels == 1 || kPanels == 2) && kRows >= 1 && kRows <= kMaxRows<kPanels>);
  constexpr int kAcc = 2 * kPanels;
  __m512 acc[kRows][kAcc];
  for (int c = 0; c < kAcc; ++c) {
    const float* b = bias[c / 2];
    const __m512 init = b != nullptr ? _mm512_loadu_ps(b + c % 2 * 16) : _mm512_setzero_ps();
    for (int r = 0; r < kRows; ++r) acc[r][c] = init;
  }
  const int64_t steps = k / 2, lines = pf.lines, second = pf.second;
  const char* ahead = pf.at;
  int64_t due = 0;
  for (int64_t kp = 0; kp < steps; ++kp) {
    __m512bh w[kAcc];
    for (int c = 0; c < kAcc; ++c)
      w[c] = (__m512bh)_mm512_loadu_si512(panels[c / 2] + kp * 2 * kPanel + c % 2 * kPanel);
    // 2 KB ahead in each panel, both lines of the k pair (one line only left every
    // other line to the hardware prefetcher, which stops at page boundaries; a
    // Zen 4 core, SmolLM2's linears cold: step 0.98x at 16 rows, 0.99x at 36).
    for (int c = 0; c < kAcc; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(panels[c / 2] + kp * 2 * kPanel + 1024 + c % 2 * kPanel),
                   _MM_HINT_T0);
    // lines / steps per k pair, spread by a running remainder (no division).
    if constexpr (kAhead)
      for (due += lines; due >= steps; due -= steps, ahead += 64) {
        _mm_prefetch(ahead, _MM_HINT_T1);
        if constexpr (kPanels == 2) _mm_prefetch(ahead + second, _MM_HINT_T1);
      }
    for (int r = 0; r < kRows; ++r) {
      uint32_t pair;
      std::memcpy(&pair, x + r * k + 2 * kp, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < kAcc; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, w[c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int p = 0; p < kPanels; ++p) {
      const __m256i lo = (__m256i)_mm512_cvtneps_pbh(acc[r][2 * p]);
      const __m256i hi = (__m256i)_mm512_cvtneps_pbh(acc[r][2 * p + 1]);
      uint16_t* dst = out + r * ldo + p * kPanel;
      if (stream) {  // whole 64-byte lines past the caches
        _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16), hi);
      }
    }
}

// panel_block for a runtime row count (1 to kMaxRows<kPanels>).
template <int kPanels>
void run_block(int rows, const uint16_t* x, int64_t k, const uint16_t* const* panels, const float* const* bias,
               uint16_t* out, int64_t ldo, const PanelPrefetch& pf, bool stream) {
  const bool ahead = pf.lines > 0;
  switch (rows) {
#define PAGODA_ROWS(r)                                                                    \
  case r:                                                                                 \
    if constexpr (r <= kMaxRows<kPanels>) {                                               \
      if (ahead) return panel_block<r, kPanels, true>(x, k, panels, bias, out, ldo, pf, stream); \
      return panel_block<r, kPanels, false>(x, k, panels, bias, out, ldo, pf, stream);    \
    }                                                                                     \
    break;
    PAGODA_ROWS(1) PAGODA_ROWS(2) PAGODA_ROWS(3) PAGODA_ROWS(4) PAGODA_ROWS(5) PAGODA_ROWS(6)
    PAGODA_ROWS(7) PAGODA_ROWS(8) PAGODA_ROWS(9) PAGODA_ROWS(10) PAGODA_ROWS(11) PAGODA_ROWS(12)
#undef PAGODA_ROWS
    default:
      break;
  }
  TORCH_CHECK(false, "run_block: ", rows, " rows against ", kPanels, " panels");
}

}  // namespace pagoda_dp
#endif  // __AVX512BF16__
