// 16-lane float vectors (GCC vector extensions: one AVX-512 register where the
// CPU has it, split into narrower registers elsewhere) and the loads, sums and
// exp the CPU kernels share. Arithmetic splits well; comparisons and cross-lane
// shuffles do not (see below), so those have AVX2 forms on 8-lane halves.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
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

// Lane-wise max, min, round-to-nearest and compare. GCC lowers a comparison
// of 64-byte vectors to scalar code, lane by lane, when the CPU lacks AVX-512
// (measured: SiLU through exp16 ran at 1.4x the time of torch's two ops on an
// AVX2 EPYC). The 16-lane forms below serve AVX-512 and plain builds; on AVX2
// the 8-lane forms use intrinsics, and exp16 runs its polynomial on each half
// (splitting a 16-lane vector costs stack moves, so it splits once, not per
// operation).
inline vec16 vmax(vec16 a, vec16 b) { return a > b ? a : b; }
inline vec16 vmin(vec16 a, vec16 b) { return a < b ? a : b; }
#ifdef __AVX512F__
inline vec16 vround(vec16 a) {
  return (vec16)_mm512_roundscale_ps((__m512)a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#else
inline vec16 vround(vec16 a) {
  vec16 r;
  for (int i = 0; i < kLanes; ++i) r[i] = __builtin_rintf(a[i]);
  return r;
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__)
#define PAGODA_AVX2_HALVES 1
typedef float vec8 __attribute__((vector_size(32)));
typedef int32_t ivec8 __attribute__((vector_size(32)));

inline vec8 vmax(vec8 a, vec8 b) { return (vec8)_mm256_max_ps((__m256)a, (__m256)b); }
inline vec8 vmin(vec8 a, vec8 b) { return (vec8)_mm256_min_ps((__m256)a, (__m256)b); }
inline vec8 vround(vec8 a) {
  return (vec8)_mm256_round_ps((__m256)a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// Halves through memcpy: a shuffle of two 8-lane vectors into one 16-lane
// vector went lane by lane through the stack.
template <typename Half, typename Whole>
inline Half half(const Whole& v, int which) {
  Half h;
  std::memcpy(&h, reinterpret_cast<const char*>(&v) + which * sizeof(Half), sizeof(Half));
  return h;
}
template <typename Whole, typename Half>
inline Whole join(Half lo, Half hi) {
  Whole w;
  std::memcpy(&w, &lo, sizeof(Half));
  std::memcpy(reinterpret_cast<char*>(&w) + sizeof(Half), &hi, sizeof(Half));
  return w;
}

// All-ones lanes where a > b (signed), zero elsewhere.
inline ivec16 greater(ivec16 a, ivec16 b) {
  const auto gt = [](ivec8 x, ivec8 y) { return (ivec8)_mm256_cmpgt_epi32((__m256i)x, (__m256i)y); };
  return join<ivec16>(gt(half<ivec8>(a, 0), half<ivec8>(b, 0)), gt(half<ivec8>(a, 1), half<ivec8>(b, 1)));
}
#else
inline ivec16 greater(ivec16 a, ivec16 b) { return a > b; }
#endif

#ifdef PAGODA_AVX2_HALVES
// 16-lane shuffles, too, go lane by lane through the stack on AVX2: the sums
// below work on 8-lane halves read straight from memory.
inline float sum(vec16 v) {
  float f[kLanes];
  std::memcpy(f, &v, sizeof(f));
  const __m256 s = _mm256_add_ps(_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8));
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
#else
inline float sum(vec16 v) {
  // Tree reduction: 4 shuffle-adds instead of 15 dependent scalar adds.
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}
#endif

inline vec16 broadcast(float x) { return vec16{} + x; }

// 1 / sqrt(mean(h^2) + eps) over a float row of n values (RMSNorm's scale).
inline float inv_rms(const float* h, int64_t n, float eps) {
  vec16 squares{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    vec16 v;
    std::memcpy(&v, h + i, sizeof(v));
    squares += v * v;
  }
  float total = sum(squares);
  for (; i < n; ++i) total += h[i] * h[i];
  return 1.f / std::sqrt(total / static_cast<float>(n) + eps);
}

// The last three levels of sum16: 8 vectors each holding two tokens' partial
// sums (w[j]: token 2j in lanes 0-7, token 2j + 1 in 8-15) -> the 16 totals.
inline vec16 sum16_pairs(const vec16* w) {
  vec16 x[4], y[2];
  for (int j = 0; j < 4; ++j)
    x[j] = __builtin_shufflevector(w[2 * j], w[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(w[2 * j], w[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int j = 0; j < 2; ++j)
    y[j] = __builtin_shufflevector(x[2 * j], x[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(x[2 * j], x[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// out[i] = sum(v[i]) for 16 vectors: a transposing tree of 15 shuffle-adds, each
// halving the lanes per token and doubling the tokens per register.
inline vec16 sum16(const vec16* v) {
  vec16 w[8];
  for (int j = 0; j < 8; ++j)
    w[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * j], v[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  return sum16_pairs(w);
}

// out[i] = sum(v[i]) for the 16 vectors at v.
inline void sum16_store(const vec16* v, float* out) {
#ifdef PAGODA_AVX2_HALVES
  // Per 8 vectors: add the halves, then hadd pairs twice, leaving each 128-bit
  // lane with 4 partial sums; adding the lanes gives 8 sums in order.
  const float* f = reinterpret_cast<const float*>(v);
  for (int g = 0; g < 2; ++g) {
    __m256 x[8];
    for (int j = 0; j < 8; ++j) {
      const float* p = f + (g * 8 + j) * kLanes;
      x[j] = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
    }
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
    const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(out + g * 8, r);
  }
#else
  const vec16 r = sum16(v);
  std::memcpy(out, &r, sizeof(r));
#endif
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
  // |v| > inf as signed ints (the sign bit is off): NaN lanes, as a bit mask.
  const uvec16 nan = reinterpret_cast<uvec16>(
      greater(reinterpret_cast<ivec16>(u & 0x7fffffffu), ivec16{} + 0x7f800000));
  return (nan & ((u >> 16) | 0x40u)) | (~nan & rounded_bits(v));
}

// bf16 bits (low halves) back to fp32 lanes.
inline vec16 widen(uvec16 bits) { return reinterpret_cast<vec16>(bits << 16); }

// bf16 bits of each lane as torch's conversion makes them (ties to even, NaN
// quieted), 16 bits a lane. With AVX512-BF16 that is vcvtneps2bf16, 2 uops
// where bf16_bits and the narrowing take about 12; the instruction reads a
// denormal input as zero, so a vector holding one (none in practice) takes
// bf16_bits instead. A rounding that stays in fp32 (round_bf16) is cheaper
// still: no check, no narrowing and widening back.
inline hvec16 bf16_halves(vec16 v) {
#ifdef __AVX512BF16__
  const __m512i mag = _mm512_and_si512(reinterpret_cast<__m512i>(v), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 denormal =
      _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fffff));
  if (__builtin_expect(denormal == 0, 1))
    return reinterpret_cast<hvec16>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(v)));
#endif
  return __builtin_convertvector(bf16_bits(v), hvec16);
}

inline vec16 widen(hvec16 halves) { return widen(__builtin_convertvector(halves, uvec16)); }
inline void store_halves(uint16_t* out, hvec16 h) { std::memcpy(out, &h, sizeof(h)); }

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
// V is vec16, or vec8 (with IV its int vector) on AVX2.
template <typename V, typename IV>
inline V exp_lanes(V x) {
  x = vmin(vmax(x, V{} - 87.f), V{} + 88.f);
  const V n = vround(x * 1.44269504088896341f);
  const V r = x - n * 0.693359375f + n * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const IV bits = (__builtin_convertvector(n, IV) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline vec16 exp16(vec16 x) {
#ifdef PAGODA_AVX2_HALVES
  return join<vec16>(exp_lanes<vec8, ivec8>(half<vec8>(x, 0)), exp_lanes<vec8, ivec8>(half<vec8>(x, 1)));
#else
  return exp_lanes<vec16, ivec16>(x);
#endif
}

// The CPU's own vector width, for loops whose body needs exp: they load and
// store at this width straight from memory, so AVX2 never splits a vec16.
#ifdef PAGODA_AVX2_HALVES
typedef vec8 vnative;
typedef ivec8 ivnative;
#else
typedef vec16 vnative;
typedef ivec16 ivnative;
#endif
constexpr int kNativeLanes = sizeof(vnative) / sizeof(float);

inline vnative load_native(const float* p) {
  vnative v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store_native(float* p, vnative v) { std::memcpy(p, &v, sizeof(v)); }
inline vnative exp_native(vnative x) { return exp_lanes<vnative, ivnative>(x); }
inline float sum_native(vnative v) {
  float total = 0.f;
  for (int i = 0; i < kNativeLanes; ++i) total += v[i];
  return total;
}

// silu(g) * u in float32: silu_and_mul_f32 and the fused half-storage gate/up
// linear (gemm_half_f32.cpp) both use it, so their results agree bit for bit.
inline vnative silu_mul_native(vnative g, vnative u) { return g / (1.f + exp_native(-g)) * u; }

// silu(g) * u for bf16 inputs widened to fp32, the activation rounded to bf16
// before the multiply as the unfused torch ops round it; silu_and_mul and the
// fused gate/up linear both use it, so their results agree bit for bit.
inline vec16 silu_mul_bf16(vec16 g, vec16 u) { return round_bf16(g / (1.f + exp16(-g))) * u; }

// The largest of p[0 .. n), skipping NaNs as std::max(m, p[i]) from -inf does.
// The scalar loop kept m on the stack (a store-to-load chain per element): 22% of
// the decode kernel's time on a Xeon.
inline float max_of(const float* p, int64_t n) {
  vnative m = vnative{} - INFINITY;
  int64_t i = 0;
  for (; i + kNativeLanes <= n; i += kNativeLanes) m = vmax(load_native(p + i), m);
  float top = -INFINITY;
  for (int j = 0; j < kNativeLanes; ++j) top = std::max(top, m[j]);
  for (; i < n; ++i) top = std::max(top, p[i]);
  return top;
}

}  // namespace
