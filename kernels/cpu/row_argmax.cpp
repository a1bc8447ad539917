// Index of each row's first maximum over float32 rows, as torch's argmax(dim=-1)
// gives it (the sampler's greedy pick over [num_seqs, vocab] logits).
//
// torch's max(dim=-1) walks a row on one thread, at about 2 G values/s: 0.7 ms of
// a 26 ms decode step for 32 x 49152 logits. Here rows are spread over the
// threads, and each lane of a native vector keeps the first maximum of its
// stride through the row; the lanes then settle by value, ties to the lower
// index. A row with a NaN returns the first NaN's index, as torch does.
//
// Shapes: x [rows, n] float32 or bf16 (rows contiguous) -> [rows] int64.
// The plain twin is worker/sample/sampler.py's row_argmax fallback.
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "vec16.h"

namespace {

// First index of the row's maximum; -1 when the row holds a NaN (the caller
// then looks for the first NaN, as torch reports it).
int64_t first_max(const float* x, int64_t n) {
  constexpr int W = kNativeLanes;
  float value = x[0];
  int64_t index = 0, i = 1;
  if (n >= 2 * W) {
    vnative best = load_native(x);
    ivnative at, where;
    for (int j = 0; j < W; ++j) at[j] = j;
    where = at;
    ivnative nan{};
    for (i = W; i + W <= n; i += W) {
      const vnative v = load_native(x + i);
      const ivnative take = v > best;  // strict: a later equal value keeps the first
      nan |= v != v;
      at += W;
      best = take ? v : best;
      where = take ? at : where;
    }
    for (int j = 0; j < W; ++j)
      if (nan[j]) return -1;
    value = best[0], index = where[0];
    for (int j = 1; j < W; ++j)
      if (best[j] > value || (best[j] == value && where[j] < index)) value = best[j], index = where[j];
  }
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return -1;
    if (x[i] > value) value = x[i], index = i;
  }
  return std::isnan(x[0]) ? -1 : index;
}

}  // namespace

torch::Tensor row_argmax(const torch::Tensor& x) {
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16 || x.scalar_type() == torch::kFloat) && x.dim() == 2 && x.stride(1) == 1,
              "row_argmax takes float32 or bf16 rows");
  TORCH_CHECK(x.size(1) > 0, "row_argmax: empty rows");
  const int64_t rows = x.size(0), n = x.size(1), stride = x.stride(0);
  auto out = torch::empty({rows}, x.options().dtype(torch::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    // bf16 rows are widened one at a time (exactly) into a buffer that stays in
    // L2: cheaper than the caller's float32 copy of the whole [rows, n] block.
    std::vector<float> widened(bf16 ? n : 0);
    for (int64_t r = begin; r < end; ++r) {
      const float* row;
      if (bf16) {
        const at::BFloat16* src = x.data_ptr<at::BFloat16>() + r * stride;
        int64_t i = 0;
        for (; i + kLanes <= n; i += kLanes) {
          const vec16 v = load(src + i);
          std::memcpy(widened.data() + i, &v, sizeof(v));
        }
        for (; i < n; ++i) widened[i] = static_cast<float>(src[i]);
        row = widened.data();
      } else {
        row = x.data_ptr<float>() + r * stride;
      }
      int64_t index = first_max(row, n);
      if (index < 0)
        for (index = 0; !std::isnan(row[index]); ++index) {
        }
      op[r] = index;
    }
  });
  return out;
}
