// Paged attention for decode (one query token per sequence) on CPU.
//
// Reads each sequence's K/V blocks in place from the paged cache (no gather
// copy), one (sequence, kv head) pair per task on ATen's thread pool, so it
// shares torch's threads instead of adding a second OpenMP runtime. All the
// query heads of a GQA group are served from one pass over their K/V.
//
// Shapes:
//   query, out:          [num_tokens, num_heads, head_dim]   (rows picked by query_rows)
//   key/value_cache:     [num_blocks, block_size, num_kv_heads, head_dim]
//   block_tables:        [num_seqs, max_num_blocks] int32
//   seq_lens, query_rows:[num_seqs] int32 / int64
//
// The plain-PyTorch twin is kernels/paged_attention_reference.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename scalar_t>
void decode_kernel(const torch::Tensor& query, const torch::Tensor& key_cache,
                   const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                   const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                   torch::Tensor& out, double scale, int64_t sliding_window) {
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_heads = query.size(1);
  const int64_t head_dim = query.size(2);
  const int64_t block_size = key_cache.size(1);
  const int64_t num_kv_heads = key_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const int64_t token_stride = num_kv_heads * head_dim;  // between tokens of a block
  const int64_t block_stride = block_size * token_stride;

  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  const scalar_t* k_ptr = key_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = value_cache.data_ptr<scalar_t>();
  const int32_t* bt_ptr = block_tables.data_ptr<int32_t>();
  const int32_t* len_ptr = seq_lens.data_ptr<int32_t>();
  const int64_t* row_ptr = query_rows.data_ptr<int64_t>();
  scalar_t* o_ptr = out.data_ptr<scalar_t>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(group * head_dim), acc(group * head_dim), scores, maxes(group), sums(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t seq = task / num_kv_heads;
      const int64_t kv_head = task % num_kv_heads;
      const int64_t len = len_ptr[seq];
      const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const int64_t span = len - first;
      const int32_t* table = bt_ptr + seq * max_blocks;
      const scalar_t* q_row = q_ptr + (row_ptr[seq] * num_heads + kv_head * group) * head_dim;
      for (int64_t i = 0; i < group * head_dim; ++i) q[i] = static_cast<float>(q_row[i]) * fscale;
      scores.resize(group * span);

      // Pass 1: scores[g, t] = q_g . k_t
      for (int64_t t = first; t < len; ++t) {
        const scalar_t* k = k_ptr + table[t / block_size] * block_stride +
                            (t % block_size) * token_stride + kv_head * head_dim;
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = q.data() + g * head_dim;
          float dot = 0.f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * static_cast<float>(k[d]);
          scores[g * span + (t - first)] = dot;
        }
      }
      // Softmax per query head.
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * span;
        float m = -INFINITY;
        for (int64_t i = 0; i < span; ++i) m = std::max(m, s[i]);
        float total = 0.f;
        for (int64_t i = 0; i < span; ++i) {
          s[i] = std::exp(s[i] - m);
          total += s[i];
        }
        sums[g] = total;
        maxes[g] = m;
      }
      // Pass 2: acc_g = sum_t p[g, t] v_t
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = first; t < len; ++t) {
        const scalar_t* v = v_ptr + table[t / block_size] * block_stride +
                            (t % block_size) * token_stride + kv_head * head_dim;
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * span + (t - first)];
          float* a = acc.data() + g * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * static_cast<float>(v[d]);
        }
      }
      scalar_t* o_row = o_ptr + (row_ptr[seq] * num_heads + kv_head * group) * head_dim;
      for (int64_t g = 0; g < group; ++g) {
        const float inv = 1.f / sums[g];
        for (int64_t d = 0; d < head_dim; ++d)
          o_row[g * head_dim + d] = static_cast<scalar_t>(acc[g * head_dim + d] * inv);
      }
    }
  });
}

}  // namespace

void paged_attention_decode(const torch::Tensor& query, const torch::Tensor& key_cache,
                            const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                            const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                            torch::Tensor& out, double scale, int64_t sliding_window) {
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous(), "query and out must be contiguous");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32, "block_tables must be int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32, "seq_lens must be int32");
  TORCH_CHECK(query_rows.scalar_type() == torch::kInt64, "query_rows must be int64");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, query.scalar_type(), "paged_attention_decode", [&] {
    decode_kernel<scalar_t>(query, key_cache, value_cache, block_tables, seq_lens, query_rows, out,
                            scale, sliding_window);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention_decode", &paged_attention_decode, "Paged attention, one query per sequence");
}
