// Fused float32 elementwise kernels of a decoder layer: RMSNorm (with the
// residual add before it), SiLU-and-mul and rotary embedding.
//
// On CPUs without fast bf16 (AVX2-only x86) the engine computes in float32,
// where each of these ran as 4-8 PyTorch ops and took about a tenth of a
// `mixed` run. Each kernel here is one pass over its rows on ATen's thread
// pool. Results match the plain-PyTorch twins up to float32 rounding, not to
// the bit: the norm sums its squares in another order, SiLU's exp is exp_native
// (relative error about 2e-7) rather than torch's, and the compiler may fuse
// RoPE's multiply-adds (-ffast-math), which rounds once where torch rounds twice.
//
// Shapes: as in elementwise.cpp (x, residual [num_tokens, hidden]; silu's
// x [num_tokens, 2 * d]); RoPE here is one head, the rows are elementwise.cpp's.
// The plain-PyTorch twins are worker/layers/{layernorm,activation,rotary}.py.
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "vec16.h"

namespace {

void check_f32_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat, name, " must be float32");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, " must be [rows, cols] with unit column stride");
}

inline void store(float* p, vec16 v) { std::memcpy(p, &v, sizeof(v)); }

// out = w * (h * rsqrt(mean(h^2) + eps)), in the twin's order of multiplications.
inline void norm_row(const float* h, const float* w, float* out, int64_t n, float eps) {
  const float inv = inv_rms(h, n, eps);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(out + i, load(w + i) * (load(h + i) * inv));
  for (; i < n; ++i) out[i] = w[i] * (h[i] * inv);
}

}  // namespace

torch::Tensor norm_rows_f32(const torch::Tensor& x, torch::Tensor* residual,
                            const torch::Tensor& weight, double eps) {
  check_f32_rows(x, "x");
  if (residual != nullptr) {
    check_f32_rows(*residual, "residual");
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes(),
                "residual must be contiguous and shaped like x");
  }
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n && weight.scalar_type() == torch::kFloat,
              "weight must be a contiguous float32 [hidden]");
  auto out = torch::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* rp = residual != nullptr ? residual->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* h = xp + r * stride;
      if (rp != nullptr) {  // residual += x, then normalise the sum
        float* res = rp + r * n;
        int64_t i = 0;
        for (; i + kLanes <= n; i += kLanes) store(res + i, load(h + i) + load(res + i));
        for (; i < n; ++i) res[i] = h[i] + res[i];
        h = res;
      }
      norm_row(h, wp, op + r * n, n, static_cast<float>(eps));
    }
  });
  return out;
}

torch::Tensor silu_and_mul_f32(const torch::Tensor& x) {
  check_f32_rows(x, "x");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: last dim must be even");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  auto out = torch::empty({rows, d}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = xp + r * stride;
      const float* up = gate + d;
      float* o = op + r * d;
      int64_t i = 0;
      for (; i + kNativeLanes <= d; i += kNativeLanes) {
        store_native(o + i, silu_mul_native(load_native(gate + i), load_native(up + i)));
      }
      for (; i < d; ++i) o[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
    }
  });
  return out;
}

// One head of NeoX-style RoPE in place: x [head_dim], c/s its position's
// cos/sin [head_dim / 2 used]; elementwise.cpp checks and walks the rows.
void rotate_head_f32(float* x, const float* c, const float* s, int64_t half) {
  int64_t i = 0;
  for (; i + kLanes <= half; i += kLanes) {
    const vec16 x1 = load(x + i), x2 = load(x + i + half);
    const vec16 ci = load(c + i), si = load(s + i);
    store(x + i, x1 * ci - x2 * si);
    store(x + i + half, x2 * ci + x1 * si);
  }
  for (; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i] + x1 * s[i];
  }
}
