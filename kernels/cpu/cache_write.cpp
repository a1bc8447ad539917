// Writes a step's new K and V rows into their slots of the paged cache.
//
// index_copy_ does this in one thread through TensorIterator; a prefill step
// writes thousands of rows per layer, so here each thread copies whole rows
// with memcpy.
//
// Shapes:
//   key, value:              [num_tokens, num_kv_heads, head_dim] (row stride free,
//                            each row's heads contiguous)
//   key_cache, value_cache:  [num_blocks, block_size, num_kv_heads, head_dim], the rows'
//                            dtype, or bf16/half under float32 rows (narrowed as
//                            torch's .to rounds: kv_half.h)
//   slot_mapping:            [num_tokens] int64, block * block_size + offset
// The plain-PyTorch twin is write_kv_reference in kernels/paged_attention_reference.py.
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "kv_half.h"

namespace {

void check_rows(const torch::Tensor& rows, const torch::Tensor& cache, const char* name) {
  TORCH_CHECK(rows.dim() == 3 && rows.stride(2) == 1 && rows.stride(1) == rows.size(2), name,
              " must be [tokens, kv_heads, head_dim] with contiguous heads per row");
  TORCH_CHECK(cache_serves(rows.scalar_type(), cache.scalar_type()), name,
              " must be in its cache's dtype (or float32 into a bf16/half cache)");
  TORCH_CHECK(rows.size(1) == cache.size(2) && rows.size(2) == cache.size(3), name,
              " does not match its cache's heads");
}

}  // namespace

void write_kv_cache(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& key_cache,
                    torch::Tensor& value_cache, const torch::Tensor& slot_mapping) {
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  check_rows(key, key_cache, "key");
  check_rows(value, value_cache, "value");
  const int64_t num_tokens = slot_mapping.size(0);
  TORCH_CHECK(key.size(0) >= num_tokens && value.size(0) >= num_tokens, "fewer rows than slots");
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t)
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " out of range");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type(), "key and value caches differ in dtype");
  if (key.scalar_type() != key_cache.scalar_type()) {
    const int64_t row_elems = key.size(1) * key.size(2);
    return with_f32_cache_type(key_cache.scalar_type(), [&](auto element) {
      using cache_t = decltype(element);
      const float* k = key.data_ptr<float>();
      const float* v = value.data_ptr<float>();
      cache_t* kc = key_cache.data_ptr<cache_t>();
      cache_t* vc = value_cache.data_ptr<cache_t>();
      at::parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          narrow_row(k + t * key.stride(0), row_elems, kc + slots[t] * row_elems);
          narrow_row(v + t * value.stride(0), row_elems, vc + slots[t] * row_elems);
        }
      });
    });
  }
  const int64_t row_bytes = key.size(1) * key.size(2) * key.element_size();
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  char* kc = static_cast<char*>(key_cache.data_ptr());
  char* vc = static_cast<char*>(value_cache.data_ptr());
  const int64_t k_stride = key.stride(0) * key.element_size();
  const int64_t v_stride = value.stride(0) * value.element_size();
  at::parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(kc + slots[t] * row_bytes, k + t * k_stride, row_bytes);
      std::memcpy(vc + slots[t] * row_bytes, v + t * v_stride, row_bytes);
    }
  });
}
