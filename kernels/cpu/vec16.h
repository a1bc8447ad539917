// 16-lane float vectors (GCC vector extensions: one AVX-512 register where the
// CPU has it, split into narrower registers elsewhere) and the loads, sums and
// exp the CPU kernels share.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

typedef float vec16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline vec16 load(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline vec16 load(const at::BFloat16* p) {
  // bf16 is the high half of an fp32: widen by shifting into place.
#ifdef __AVX512F__
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return reinterpret_cast<vec16>(_mm512_slli_epi32(wide, 16));
#else
  uint16_t raw[kLanes];
  std::memcpy(raw, p, sizeof(raw));
  uint32_t wide[kLanes];
  for (int i = 0; i < kLanes; ++i) wide[i] = static_cast<uint32_t>(raw[i]) << 16;
  vec16 v;
  std::memcpy(&v, wide, sizeof(v));
  return v;
#endif
}

inline vec16 load(const at::Half* p) {
  vec16 v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
}

typedef int32_t ivec16 __attribute__((vector_size(64)));

inline float sum(vec16 v) {
  // Tree reduction: 4 shuffle-adds instead of 15 dependent scalar adds.
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

inline vec16 broadcast(float x) { return vec16{} + x; }

// out[i] = sum(v[i]) for 16 vectors: a transposing tree of 15 shuffle-adds, each
// halving the lanes per token and doubling the tokens per register.
inline vec16 sum16(const vec16* v) {
  vec16 w[8], x[4], y[2];
  for (int j = 0; j < 8; ++j)
    w[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * j], v[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int j = 0; j < 4; ++j)
    x[j] = __builtin_shufflevector(w[2 * j], w[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(w[2 * j], w[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int j = 0; j < 2; ++j)
    y[j] = __builtin_shufflevector(x[2 * j], x[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(x[2 * j], x[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

typedef uint32_t uvec16 __attribute__((vector_size(64)));
typedef uint16_t hvec16 __attribute__((vector_size(32)));

// The nearest bf16 (ties to even) of each finite lane, as torch's conversion
// rounds: the bf16 bits in each lane's low half.
inline uvec16 rounded_bits(vec16 v) {
  const uvec16 u = reinterpret_cast<uvec16>(v);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// The same for any lane: NaN stays a quiet NaN, as in torch's conversion.
inline uvec16 bf16_bits(vec16 v) {
  const uvec16 u = reinterpret_cast<uvec16>(v);
  return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded_bits(v);
}

// bf16 bits (low halves) back to fp32 lanes.
inline vec16 widen(uvec16 bits) { return reinterpret_cast<vec16>(bits << 16); }

inline void store_bits(uint16_t* out, uvec16 bits) {
  const hvec16 h = __builtin_convertvector(bits, hvec16);
  std::memcpy(out, &h, sizeof(h));
}

// Round each finite lane to the nearest bf16; the result is still an fp32 vector.
inline vec16 round_bf16(vec16 v) { return widen(rounded_bits(v)); }

// Store 16 finite fp32 lanes as bf16 (ties to even).
inline void store_bf16(uint16_t* out, vec16 v) { store_bits(out, rounded_bits(v)); }

// exp(x) for x in [-87, 88] (clamped there): 2^n * p(r) with x = n ln2 + r,
// |r| <= ln2 / 2, p a degree-6 polynomial; relative error about 2e-7, like expf.
inline vec16 exp16(vec16 x) {
  x = x < broadcast(-87.f) ? broadcast(-87.f) : x;
  x = x > broadcast(88.f) ? broadcast(88.f) : x;
  const vec16 n = __builtin_convertvector(
      __builtin_convertvector(x * 1.44269504088896341f + 0.5f - (x < broadcast(0.f) ? broadcast(1.f) : broadcast(0.f)), ivec16),
      vec16);
  const vec16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vec16 p = broadcast(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const ivec16 bits = (__builtin_convertvector(n, ivec16) + 127) << 23;
  vec16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace
