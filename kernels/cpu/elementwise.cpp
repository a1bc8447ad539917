// Fused bf16 elementwise kernels of a decoder layer: RMSNorm (with the
// residual add before it), SiLU-and-mul and rotary embedding. The entry points
// hand float32 rows (for RoPE, single heads) to elementwise_f32.cpp.
//
// PyTorch runs each of these as 4-8 separate ops, each a pass over memory
// plus a dispatch; at decode batch sizes the dispatches dominate. Each kernel
// here is one pass, one row per task on ATen's thread pool, arithmetic in
// fp32 and a bf16 rounding wherever the plain-PyTorch twin rounds, so the
// two agree to the last bit except for the order of the sum in the norm. The
// loops are written on 16-lane vectors (the norm and RoPE were scalar loops
// before, 3-5x the time of a copy of their data at 4096 rows), with a scalar
// tail where a row is not a multiple of 16.
//
// Shapes:
//   rms_norm, add_rms_norm:  x, residual [num_tokens, hidden], weight [hidden]
//   silu_and_mul:            x [num_tokens, 2 * d] -> [num_tokens, d]
//   rotary_embedding:        query [num_tokens, num_heads * head_dim] (row stride free),
//                            key [num_tokens, num_kv_heads * head_dim] (row stride free),
//                            positions [num_tokens] int64,
//                            cos/sin_cache [max_position, head_dim] (both halves equal)
//   rope_write_kv:           qkv [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim] (row
//                            stride free), positions and slot_mapping [num_tokens] int64,
//                            key/value_cache [num_blocks, block_size, num_kv_heads, head_dim] in
//                            qkv's dtype, or bf16/half under float32 qkv (kv_half.h)
// The plain-PyTorch twins are worker/layers/{layernorm,activation,rotary}.py (rope_write_kv:
// rotary.py's, then write_kv_reference in kernels/paged_attention_reference.py).
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kv_half.h"
#include "vec16.h"

namespace {

inline float to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch's float -> bfloat16 conversion does (NaN kept quiet).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_bf16(float f) { return to_f32(to_bf16(f)); }

const uint16_t* bits(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
uint16_t* mutable_bits(torch::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
}

void check_bf16_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16, name, " must be bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, " must be [rows, cols] with unit column stride");
}

inline vec16 load_bf16(const uint16_t* p) { return load(reinterpret_cast<const at::BFloat16*>(p)); }

// out[i] = w[i] * bf16(h[i] * rsqrt(mean(h^2) + eps)), h already bf16-rounded (fp32 here).
// The inner rounding stays in fp32 registers (round_bf16, as in rotate_head_bf16).
inline void norm_row(const float* h, const uint16_t* w, uint16_t* out, int64_t n, float eps) {
  const float inv = inv_rms(h, n, eps);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    store_halves(out + i, bf16_halves(load_bf16(w + i) * round_bf16(load(h + i) * inv)));
  for (; i < n; ++i) out[i] = to_bf16(to_f32(w[i]) * round_bf16(h[i] * inv));
}

constexpr int64_t kMaxHidden = 16384;

// RMSNorm of each row of x, first adding it into `residual` (in place) when given.
torch::Tensor norm_rows(const torch::Tensor& x, torch::Tensor* residual, const torch::Tensor& weight,
                        double eps) {
  check_bf16_rows(x, "x");
  if (residual != nullptr) {
    check_bf16_rows(*residual, "residual");
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes(),
                "residual must be contiguous and shaped like x");
  }
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(n <= kMaxHidden, "rms_norm: hidden size ", n, " too large");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n && weight.scalar_type() == torch::kBFloat16,
              "weight must be a contiguous bf16 [hidden]");
  auto out = torch::empty({rows, n}, x.options());
  const uint16_t* xp = bits(x);
  const uint16_t* wp = bits(weight);
  uint16_t* rp = residual != nullptr ? mutable_bits(*residual) : nullptr;
  uint16_t* op = mutable_bits(out);
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    float h[kMaxHidden];
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* xr = xp + r * stride;
      int64_t i = 0;
      if (rp == nullptr) {
        for (; i + kLanes <= n; i += kLanes) {
          const vec16 v = load_bf16(xr + i);
          std::memcpy(h + i, &v, sizeof(v));
        }
        for (; i < n; ++i) h[i] = to_f32(xr[i]);
      } else {
        uint16_t* res = rp + r * n;
        for (; i + kLanes <= n; i += kLanes) {
          const hvec16 bits = bf16_halves(load_bf16(xr + i) + load_bf16(res + i));
          store_halves(res + i, bits);
          const vec16 v = widen(bits);
          std::memcpy(h + i, &v, sizeof(v));
        }
        for (; i < n; ++i) {
          res[i] = to_bf16(to_f32(xr[i]) + to_f32(res[i]));
          h[i] = to_f32(res[i]);
        }
      }
      norm_row(h, wp, op + r * n, n, static_cast<float>(eps));
    }
  });
  return out;
}

}  // namespace

// float32 rows go to elementwise_f32.cpp.
torch::Tensor norm_rows_f32(const torch::Tensor& x, torch::Tensor* residual,
                            const torch::Tensor& weight, double eps);
torch::Tensor silu_and_mul_f32(const torch::Tensor& x);
void rotate_head_f32(float* x, const float* c, const float* s, int64_t half);

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (x.scalar_type() == torch::kFloat) return norm_rows_f32(x, nullptr, weight, eps);
  return norm_rows(x, nullptr, weight, eps);
}

torch::Tensor add_rms_norm(const torch::Tensor& x, torch::Tensor& residual,
                           const torch::Tensor& weight, double eps) {
  if (x.scalar_type() == torch::kFloat) return norm_rows_f32(x, &residual, weight, eps);
  return norm_rows(x, &residual, weight, eps);
}

torch::Tensor silu_and_mul(const torch::Tensor& x) {
  if (x.scalar_type() == torch::kFloat) return silu_and_mul_f32(x);
  check_bf16_rows(x, "x");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: last dim must be even");
  auto out = torch::empty({rows, d}, x.options());
  const uint16_t* xp = bits(x);
  uint16_t* op = mutable_bits(out);
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = xp + r * stride;
      const uint16_t* up = gate + d;
      uint16_t* o = op + r * d;
      int64_t i = 0;
      for (; i + kLanes <= d; i += kLanes) {
        const vec16 g = load(reinterpret_cast<const at::BFloat16*>(gate + i));
        const vec16 u = load(reinterpret_cast<const at::BFloat16*>(up + i));
        store_bf16(o + i, silu_mul_bf16(g, u));
      }
      for (; i < d; ++i) {
        const float g = to_f32(gate[i]);
        const float act = round_bf16(g / (1.f + std::exp(-g)));
        o[i] = to_bf16(act * to_f32(up[i]));
      }
    }
  });
  return out;
}

namespace {

// One bf16 head in place: the same ops and roundings as the twin.
void rotate_head_bf16(uint16_t* x, const uint16_t* c, const uint16_t* s, int64_t half) {
  int64_t i = 0;
  for (; i + kLanes <= half; i += kLanes) {  // 16 lanes at a time
    const vec16 x1 = load_bf16(x + i), x2 = load_bf16(x + i + half);
    const vec16 ci = load_bf16(c + i), si = load_bf16(s + i);
    // The products' roundings stay in fp32 registers (round_bf16: integer ops,
    // ties to even, denormals kept), which is bf16_halves then widen for every
    // finite lane and keeps NaN a NaN; the stored sums go through bf16_halves.
    store_halves(x + i, bf16_halves(round_bf16(x1 * ci) - round_bf16(x2 * si)));
    store_halves(x + i + half, bf16_halves(round_bf16(x2 * ci) + round_bf16(x1 * si)));
  }
  for (; i < half; ++i) {
    const float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
    const float ci = to_f32(c[i]), si = to_f32(s[i]);
    // Rounded per op, as the twin's bf16 tensor ops are.
    const float o1 = round_bf16(round_bf16(x1 * ci) - round_bf16(x2 * si));
    const float o2 = round_bf16(round_bf16(x2 * ci) + round_bf16(x1 * si));
    x[i] = to_bf16(o1);
    x[i + half] = to_bf16(o2);
  }
}

// Every head of q and k of every row, each rotated by `rotate` with its
// position's cos/sin rows. T is the element storage: uint16_t (bf16) or float.
template <typename T, typename Rotate>
void rope_rows(torch::Tensor& query, torch::Tensor& key, const torch::Tensor& positions, const T* cp,
               const T* sp, int64_t head_dim, int64_t max_position, Rotate rotate) {
  const int64_t rows = query.size(0), half = head_dim / 2;
  const int64_t* pos = positions.data_ptr<int64_t>();
  struct Target {
    T* base;
    int64_t stride, heads;
  } targets[2] = {{static_cast<T*>(query.data_ptr()), query.stride(0), query.size(1) / head_dim},
                  {static_cast<T*>(key.data_ptr()), key.stride(0), key.size(1) / head_dim}};
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = pos[r];
      TORCH_CHECK(p >= 0 && p < max_position, "rotary_embedding: position ", p, " out of range");
      for (const Target& t : targets)
        for (int64_t h = 0; h < t.heads; ++h)
          rotate(t.base + r * t.stride + h * head_dim, cp + p * head_dim, sp + p * head_dim, half);
    }
  });
}

}  // namespace

void rotary_embedding(torch::Tensor& query, torch::Tensor& key, const torch::Tensor& positions,
                      const torch::Tensor& cos_cache, const torch::Tensor& sin_cache,
                      int64_t head_dim) {
  const bool f32 = query.scalar_type() == torch::kFloat;
  const auto dtype = f32 ? torch::kFloat : torch::kBFloat16;
  const char* dtype_name = f32 ? "float32" : "bfloat16";
  const auto check_rows = [&](const torch::Tensor& x, const char* name) {
    TORCH_CHECK(x.scalar_type() == dtype, name, " must be ", dtype_name);
    TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, " must be [rows, cols] with unit column stride");
  };
  check_rows(query, "query");
  check_rows(key, "key");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous(),
              "positions must be contiguous int64");
  TORCH_CHECK(cos_cache.is_contiguous() && sin_cache.is_contiguous() &&
                  cos_cache.scalar_type() == dtype && sin_cache.scalar_type() == dtype &&
                  cos_cache.size(1) == head_dim,
              "cos/sin caches must be contiguous ", dtype_name, " [max_position, head_dim]");
  TORCH_CHECK(query.size(1) % head_dim == 0 && key.size(1) % head_dim == 0 && head_dim % 2 == 0,
              "query/key widths must be multiples of an even head_dim");
  const int64_t max_position = cos_cache.size(0);
  if (f32)
    return rope_rows(query, key, positions, cos_cache.data_ptr<float>(), sin_cache.data_ptr<float>(),
                     head_dim, max_position, rotate_head_f32);
  rope_rows(query, key, positions, bits(cos_cache), bits(sin_cache), head_dim, max_position,
            rotate_head_bf16);
}

namespace {

// Decode steps (the decode plan's 1-6 rows): RoPE on the fused QKV rows in place, then each row's
// rotated K and its V copied into their cache slot. The same rotations as
// rotary_embedding and the same copies as write_kv_cache (cache_write.cpp), in
// one call instead of two plus three views: a batch-1 step makes 30 of them.
// Serial over rows: it is called for a handful of rows, where a parallel region
// costs more than the work.
// C: the cache's element type, T's or (under float32 rows) a half type.
template <typename T, typename C, typename Rotate>
void rope_write_rows(torch::Tensor& qkv, const int64_t* pos, const T* cp, const T* sp,
                     C* kc, C* vc, const int64_t* slots, int64_t num_heads, int64_t num_kv_heads,
                     int64_t head_dim, Rotate rotate) {
  const int64_t rows = qkv.size(0), half = head_dim / 2, stride = qkv.stride(0);
  const int64_t kv_width = num_kv_heads * head_dim;
  T* base = static_cast<T*>(qkv.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    T* row = base + r * stride;
    const T* c = cp + pos[r] * head_dim;
    const T* s = sp + pos[r] * head_dim;
    for (int64_t h = 0; h < num_heads + num_kv_heads; ++h) rotate(row + h * head_dim, c, s, half);
    const T* k = row + num_heads * head_dim;
    if constexpr (std::is_same_v<T, C>) {
      std::memcpy(kc + slots[r] * kv_width, k, kv_width * sizeof(T));
      std::memcpy(vc + slots[r] * kv_width, k + kv_width, kv_width * sizeof(T));
    } else {
      narrow_row(k, kv_width, kc + slots[r] * kv_width);
      narrow_row(k + kv_width, kv_width, vc + slots[r] * kv_width);
    }
  }
}

}  // namespace

void rope_write_kv(torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& cos_cache,
                   const torch::Tensor& sin_cache, torch::Tensor& key_cache, torch::Tensor& value_cache,
                   const torch::Tensor& slot_mapping, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim) {
  const bool f32 = qkv.scalar_type() == torch::kFloat;
  TORCH_CHECK(f32 || qkv.scalar_type() == torch::kBFloat16, "qkv must be bfloat16 or float32");
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "qkv must be [rows, cols] with unit column stride");
  TORCH_CHECK(head_dim % 2 == 0 && qkv.size(1) == (num_heads + 2 * num_kv_heads) * head_dim,
              "qkv must be [rows, (num_heads + 2 * num_kv_heads) * head_dim], head_dim even");
  const int64_t rows = qkv.size(0);
  for (const torch::Tensor* t : {&positions, &slot_mapping})
    TORCH_CHECK(t->scalar_type() == torch::kInt64 && t->is_contiguous() && t->numel() == rows,
                "positions and slot_mapping must be contiguous int64, one per row");
  for (const torch::Tensor* t : {&cos_cache, &sin_cache})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == qkv.scalar_type(),
                "cos/sin caches must be contiguous, in qkv's dtype");
  const auto cache_type = key_cache.scalar_type();
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && value_cache.scalar_type() == cache_type &&
                  cache_serves(qkv.scalar_type(), cache_type),
              "KV caches must be contiguous, in qkv's dtype (or bf16/half under float32 qkv)");
  TORCH_CHECK(cos_cache.size(1) == head_dim && sin_cache.sizes() == cos_cache.sizes(),
              "cos/sin caches must be [max_position, head_dim]");
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes() &&
                  key_cache.size(2) == num_kv_heads && key_cache.size(3) == head_dim,
              "KV caches must be [num_blocks, block_size, num_kv_heads, head_dim]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t max_position = cos_cache.size(0), num_slots = key_cache.size(0) * key_cache.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < max_position, "rope_write_kv: position ", pos[r], " out of range");
    TORCH_CHECK(slots[r] >= 0 && slots[r] < num_slots, "rope_write_kv: slot ", slots[r], " out of range");
  }
  if (f32)
    return with_f32_cache_type(cache_type, [&](auto element) {
      using cache_t = decltype(element);
      rope_write_rows(qkv, pos, cos_cache.data_ptr<float>(), sin_cache.data_ptr<float>(),
                      key_cache.data_ptr<cache_t>(), value_cache.data_ptr<cache_t>(), slots, num_heads,
                      num_kv_heads, head_dim, rotate_head_f32);
    });
  rope_write_rows(qkv, pos, bits(cos_cache), bits(sin_cache), mutable_bits(key_cache),
                  mutable_bits(value_cache), slots, num_heads, num_kv_heads, head_dim, rotate_head_bf16);
}
