// A half-precision (bf16 or fp16) KV cache under a float32 engine: rows narrowed
// as they are written, widened in registers as they are read.
//
// On a CPU without fast bf16 arithmetic (AVX2) a half checkpoint runs in float32
// with its linear weights stored half (worker/layers/cpu_half_f32.py); its K/V
// are stored half too (--kv-cache-dtype auto, worker/runner/kv_memory.py), which
// halves what decode attention reads and doubles the tokens a cache holds.
// The float32 kernels take such caches through these loads: q, scores and
// accumulators stay float32, as in transformers' bf16 model with its K/V in bf16
// (each value rounded once, when written).
#pragma once

#include "vec16.h"  // and immintrin.h

namespace {

// Whether a kernel whose activations are `act` reads and writes a `cache` cache:
// the same dtype, or bf16/half under float32.
inline bool cache_serves(at::ScalarType act, at::ScalarType cache) {
  return cache == act || (act == at::kFloat && (cache == at::kBFloat16 || cache == at::kHalf));
}

// fn(a value of the element type of a float32 kernel's `cache`: float, bf16 or half).
template <typename Fn>
decltype(auto) with_f32_cache_type(at::ScalarType cache, Fn&& fn) {
  if (cache == at::kBFloat16) return fn(at::BFloat16{});
  if (cache == at::kHalf) return fn(at::Half{});
  return fn(float{});
}

// Any cache element type to float32 lanes of the CPU's native width.
inline vnative load_native(const at::BFloat16* p) {
#ifdef PAGODA_AVX2_HALVES
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return reinterpret_cast<vnative>(_mm256_slli_epi32(wide, 16));
#else
  return load(p);
#endif
}

inline vnative load_native(const at::Half* p) {
#if defined(PAGODA_AVX2_HALVES) && defined(__F16C__)
  return reinterpret_cast<vnative>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX512F__)
  return reinterpret_cast<vnative>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#else
  vnative v;
  for (int i = 0; i < kNativeLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

// n float32 values into a cache row: as torch's .to(dtype) rounds (ties to
// even; fp16 overflows to inf; NaN stays NaN). The same bytes as a plain copy
// when the cache is float32.
inline void narrow_row(const float* in, int64_t n, float* out) { std::memcpy(out, in, n * sizeof(float)); }

inline void narrow_row(const float* in, int64_t n, at::BFloat16* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store_halves(reinterpret_cast<uint16_t*>(out + i), bf16_halves(load(in + i)));
  for (; i < n; ++i) out[i] = static_cast<at::BFloat16>(in[i]);
}

inline void narrow_row(const float* in, int64_t n, at::Half* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) out[i] = static_cast<at::Half>(in[i]);
}

// n bf16/half cache values widened into float32 (a flash tile's rows).
template <typename half_t>
inline void widen_row(const half_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kNativeLanes <= n; i += kNativeLanes) store_native(out + i, load_native(in + i));
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

}  // namespace
