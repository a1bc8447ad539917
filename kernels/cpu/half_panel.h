// One k step of a half panel (pack_half_panels, gemm_half_f32.cpp): 16 output
// columns stored in bf16 or fp16, widened to float32 in two registers. Shared
// by the half GEMM (gemm_half_f32.cpp) and the few-row GEMV (gemv_f32.cpp),
// which read the same panels.
//
// Column order within a k step (the 16 halves, 32 bytes):
// * fp16: columns 0-15 in order; F16C's vcvtph2ps widens 8 at a time.
// * bf16: interleaved, position 2i column i and position 2i + 1 column i + 8,
//   so each 32-bit word holds (column i, column i + 8) as (low, high) halves.
//   A bf16 is the top half of its float32, so one 32-byte load gives both
//   halves of the step: columns 0-7 = word << 16, columns 8-15 = word AND
//   0xFFFF0000. Two single-uop integer ops, where columns in order needed two
//   16-byte loads, two vpmovzxwd and two vpslld. On CPUs whose vector units are
//   128 bits wide (Zen 1: each 256-bit op is two uops) vpmovzxwd takes a
//   shuffle port FMAs use too; at 2-8 rows the widen competes with the FMAs.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace pagoda_half {

constexpr int kPanel = 16;  // output columns per panel

// The 16 columns of the k step at p -> lo (columns 0-7) and hi (8-15), float32.
template <bool kBf16>
inline void widen16(const uint16_t* p, __m256& lo, __m256& hi) {
  if constexpr (kBf16) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
}

}  // namespace pagoda_half
