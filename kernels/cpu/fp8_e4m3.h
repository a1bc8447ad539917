// FP8 e4m3 (float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, largest 448)
// to and from float32, 16 lanes at a time in integer arithmetic: Zen 4/5 and
// AVX2 have no fp8 conversion instructions.
//
// Narrowing rounds to nearest, ties to even, as torch's float -> float8_e4m3fn
// cast does, and saturates at +-448 first (where a plain cast gives NaN), so a
// cache written here holds the very bytes the plain-PyTorch twin writes
// (kernels/paged_attention_reference.py: _to_cache). Widening is exact: every
// e4m3 value is a float32. Subnormals (|x| < 2^-6, steps of 2^-9) are computed
// as integers times 2^-9, never as float32 denormals, so flush-to-zero modes
// (-ffast-math) cannot change them.
#pragma once

#include <cstdint>
#include <cstring>

#include "vec16.h"

namespace {

typedef uint8_t bvec16 __attribute__((vector_size(16)));

// 16 e4m3 bytes -> 16 float32 lanes. NaN bytes (never written by the
// saturating narrowing below) widen to +-480.
inline vec16 widen_e4m3(const uint8_t* p) {
  bvec16 raw;
  std::memcpy(&raw, p, sizeof(raw));
  const uvec16 b = __builtin_convertvector(raw, uvec16);
  const uvec16 mag = b & 0x7fu;  // exponent and mantissa
  // Normal: the 7 bits land at the top of float32's exponent field and its
  // mantissa's first 3 bits; the exponent rebias 127 - 7 is added in place.
  const uvec16 normal = (mag << 20) + (120u << 23);
  // Subnormal (exponent 0): mantissa * 2^-9, a normal float32.
  const vec16 sub = __builtin_convertvector(reinterpret_cast<ivec16>(mag), vec16) * (1.f / 512.f);
  const uvec16 is_normal = reinterpret_cast<uvec16>(greater(reinterpret_cast<ivec16>(mag), ivec16{} + 7));
  const uvec16 bits = (is_normal & normal) | (~is_normal & reinterpret_cast<uvec16>(sub));
  return reinterpret_cast<vec16>(bits | ((b & 0x80u) << 24));
}

// 16 float32 lanes -> e4m3 codes (one per uint32 lane), saturating at +-448;
// NaN -> 0x7f with its sign.
inline uvec16 e4m3_codes(vec16 x) {
  const uvec16 u = reinterpret_cast<uvec16>(x);
  const uvec16 sign = (u >> 24) & 0x80u;
  const uvec16 abs_bits = u & 0x7fffffffu;
  const uvec16 nan = reinterpret_cast<uvec16>(
      greater(reinterpret_cast<ivec16>(abs_bits), ivec16{} + 0x7f800000));
  // 448 = 0x43e00000; NaN lanes are fixed below, so an int compare on the bits
  // clamps (the magnitudes are ordered as their bit patterns).
  const uvec16 over = reinterpret_cast<uvec16>(
      greater(reinterpret_cast<ivec16>(abs_bits), ivec16{} + 0x43e00000));
  const uvec16 a = (over & 0x43e00000u) | (~over & abs_bits);
  // Normal range: drop 20 mantissa bits rounding ties to even, then rebias.
  const uvec16 normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  // Below 2^-6 (0x3c800000): the nearest multiple of 2^-9, ties to even; 8 is
  // 2^-6, whose code is 0x08 too.
  const vec16 scaled = vround(reinterpret_cast<vec16>(a) * 512.f);
  const uvec16 sub = reinterpret_cast<uvec16>(__builtin_convertvector(scaled, ivec16));
  const uvec16 is_normal = reinterpret_cast<uvec16>(greater(reinterpret_cast<ivec16>(a), ivec16{} + 0x3c7fffff));
  const uvec16 code = (is_normal & normal) | (~is_normal & sub);
  return ((nan & 0x7fu) | (~nan & code)) | sign;
}

inline void store_e4m3(uint8_t* out, vec16 x) {
  const bvec16 b = __builtin_convertvector(e4m3_codes(x), bvec16);
  std::memcpy(out, &b, sizeof(b));
}

}  // namespace
