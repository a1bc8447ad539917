// Paged attention for decode (one query token per sequence) on CPU.
//
// Reads each sequence's K/V blocks in place from the paged cache (no gather
// copy), one (sequence, kv head) pair per task on ATen's thread pool, so it
// shares torch's threads instead of adding a second OpenMP runtime. All the
// query heads of a GQA group are served from one pass over their K/V, with
// 16-lane vectors (GCC vector extensions: AVX-512 where the CPU has it,
// split into narrower registers elsewhere) and accumulators in registers.
//
// Shapes:
//   query, out:          [num_tokens, num_heads, head_dim]   (rows picked by query_rows); query's rows
//                        may be strided (a view of the fused QKV output), out is contiguous
//   key/value_cache:     [num_blocks, block_size, num_kv_heads, head_dim]
//   block_tables:        [num_seqs, max_num_blocks] int32
//   seq_lens, query_rows:[num_seqs] int32 / int64
//   prefix_out, prefix_lse (cascade, optional): [num_kv_heads, num_seqs * group,
//                        head_dim] / [num_kv_heads, num_seqs * group] float32, the
//                        attention over the first prefix_len tokens
//                        (cascade_prefix.cpp); this kernel then attends tokens
//                        [prefix_len, seq_len) and merges the two by log-sum-exp.
//
// The plain-PyTorch twin is kernels/paged_attention_reference.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "decode_head_tile.h"
#include "vec16.h"

namespace {

// float32 at the CPU's own vector width (8 lanes on AVX2, where GCC moved each
// 16-lane dot through the stack on its way to `dots`: 5 GB/s). Each dot entry
// is 16 floats whose total is the dot product: with 8-lane vectors, two
// accumulators fill its halves.
constexpr int kDotVectors = kLanes / kNativeLanes;

// dots[head, pending] for the `group` query heads of KV head h, against key row k.
template <int kChunks>
inline void float_dots(const float* q, const float* k, int h, int group, int64_t pending, float* dots) {
  constexpr int kPieces = kChunks * kLanes / kNativeLanes;  // native vectors per head row
  vnative kv[kPieces];
  for (int p = 0; p < kPieces; ++p) kv[p] = load_native(k + (h * kPieces + p) * kNativeLanes);
  for (int g = 0; g < group; ++g) {
    const int head = h * group + g;
    const float* qh = q + head * kPieces * kNativeLanes;
    vnative d[kDotVectors] = {};
    for (int p = 0; p < kPieces; ++p) d[p % kDotVectors] += load_native(qh + p * kNativeLanes) * kv[p];
    float* out = dots + (head * kLanes + pending) * kLanes;
    for (int j = 0; j < kDotVectors; ++j) store_native(out + j * kNativeLanes, d[j]);
  }
}

// acc[head] += p[head, t] * v for the `group` query heads of KV head h; the
// scores of query head i start at scores[i * span].
template <int kChunks>
inline void float_weighted_sum(const float* scores, int64_t span, const float* v, int h, int group,
                               float* acc) {
  constexpr int kPieces = kChunks * kLanes / kNativeLanes;
  vnative vv[kPieces];
  for (int p = 0; p < kPieces; ++p) vv[p] = load_native(v + (h * kPieces + p) * kNativeLanes);
  for (int g = 0; g < group; ++g) {
    const int head = h * group + g;
    const float weight = scores[head * span];
    float* a = acc + head * kPieces * kNativeLanes;
    for (int p = 0; p < kPieces; ++p)
      store_native(a + p * kNativeLanes, load_native(a + p * kNativeLanes) + weight * vv[p]);
  }
}

// One float32 sequence: every KV head per token, reading each token's whole K
// (then V) row once, contiguously. (bf16 and half go KV head by KV head:
// decode_head_tile.h.)
template <int kChunks>
void decode_sequence_f32(const float* q_row, const float* k_base, const float* v_base, const SeqLayout& s,
                         int num_kv_heads, int group, float scale, const Prefix& prefix,
                         std::vector<float>& scores, std::vector<vec16>& work, float* o_row) {
  const int num_heads = num_kv_heads * group;
  const int64_t span = s.len - s.first;
  // work: num_heads * kChunks query vectors, as many accumulators, then
  // num_heads * kLanes dot vectors.
  work.resize(static_cast<size_t>(num_heads) * (2 * kChunks + kLanes));
  vec16* q = work.data();
  vec16* acc = q + num_heads * kChunks;
  for (int i = 0; i < num_heads * kChunks; ++i) {
    q[i] = load(q_row + i * kLanes) * scale;
    acc[i] = vec16{};
  }
  scores.resize(static_cast<size_t>(num_heads) * span);

  // Pass 1: scores[head, t] = q_head . k_t. The dot vectors of kLanes tokens
  // collect in `dots`, and one transposing reduction (sum16) turns them into a
  // vector of scores: 15 shuffle-adds per 16 tokens instead of 4 per token.
  vec16* dots = acc + num_heads * kChunks;  // [num_heads, kLanes]
  int64_t pending = 0;                      // tokens whose dots wait in `dots`
  auto flush = [&](int64_t t_end) {
    const int64_t offset = t_end - pending - s.first;
    for (int head = 0; head < num_heads; ++head) {
      float* out = scores.data() + head * span + offset;
      const vec16* d = dots + head * kLanes;
      if (pending == kLanes) {
        sum16_store(d, 1.f, out);
      } else {
        for (int64_t i = 0; i < pending; ++i) out[i] = sum(d[i]);
      }
    }
    pending = 0;
  };
  for_each_token<kRowPrefetchBlocks>(k_base, s, 0, s.token_stride, [&](const float* k, int64_t t) {
    for (int h = 0; h < num_kv_heads; ++h)
      float_dots<kChunks>(reinterpret_cast<const float*>(q), k, h, group, pending, reinterpret_cast<float*>(dots));
    if (++pending == kLanes) flush(t + 1);
  });
  if (pending > 0) flush(s.len);
  std::vector<PartWeights> weights(num_heads);
  for (int head = 0; head < num_heads; ++head)
    weights[head] = softmax_in_place(scores.data() + head * span, span, prefix, head, group);
  // Pass 2: out_head = sum_t p[head, t] v_t
  for_each_token<kRowPrefetchBlocks>(v_base, s, 0, s.token_stride, [&](const float* v, int64_t t) {
    for (int h = 0; h < num_kv_heads; ++h)
      float_weighted_sum<kChunks>(scores.data() + t - s.first, span, v, h, group, reinterpret_cast<float*>(acc));
  });
  for (int head = 0; head < num_heads; ++head)
    store_head<float, kChunks>(acc + head * kChunks, weights[head], prefix, head, group, o_row);
}

template <typename scalar_t, int kChunks>
void decode_kernel(const torch::Tensor& query, const torch::Tensor& key_cache,
                   const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                   const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                   torch::Tensor& out, double scale, int64_t sliding_window, int64_t prefix_len,
                   const float* prefix_out, const float* prefix_lse) {
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_heads = query.size(1);
  const int64_t head_dim = query.size(2);
  const int64_t block_size = key_cache.size(1);
  const int num_kv_heads = static_cast<int>(key_cache.size(2));
  const int group = static_cast<int>(num_heads / num_kv_heads);
  const int64_t max_blocks = block_tables.size(1);
  const int64_t block_stride = block_size * num_kv_heads * head_dim;

  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  const int64_t q_stride = query.stride(0);  // query may be a view of the fused QKV rows
  const scalar_t* k_ptr = key_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = value_cache.data_ptr<scalar_t>();
  const int32_t* bt_ptr = block_tables.data_ptr<int32_t>();
  const int32_t* len_ptr = seq_lens.data_ptr<int32_t>();
  const int64_t* row_ptr = query_rows.data_ptr<int64_t>();
  scalar_t* o_ptr = out.data_ptr<scalar_t>();

  // Sequences longest first through an atomic counter: contexts differ by 10x
  // within a step, and static halves left one core idle (64 sequences of 16-384
  // tokens sorted by length: 528 us in halves, 369 us shuffled).
  std::vector<int64_t> order(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return len_ptr[a] > len_ptr[b]; });
  // First token attended: past a sliding window's start and a cascade's prefix.
  auto attended_from = [&](int64_t len) {
    return std::max(sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0, prefix_len);
  };
  const int64_t row_bytes = num_kv_heads * head_dim * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t block_bytes = block_size * row_bytes;
  // Token rows of K and V one sequence's walk reads per token.
  const int64_t passes = std::is_same_v<scalar_t, float> ? 2 : head_tile_passes<kChunks>(num_kv_heads, group);
  // Reading ahead paid from 4 sequences per thread (Zen 4, KV in DRAM: 8 x 32-160
  // tokens 0.87x, 64 x 16-384 0.82x) and cost at 2 (4 x 100-300: 1.08-1.34x).
  const int64_t threads = std::min<int64_t>(num_seqs, at::get_num_threads());
  const bool read_ahead = num_seqs >= 4 * threads;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<vec16> work;
    // Reading ahead, the next sequence is claimed before this one is done; otherwise
    // after, which balances the cores better.
    for (int64_t n = next++; n < num_seqs;) {
      const int64_t ahead = read_ahead ? next++ : num_seqs;
      const int64_t seq = order[n];
      const int64_t len = len_ptr[seq];
      const int64_t first = attended_from(len);
      const int64_t q_offset = row_ptr[seq] * q_stride, row_offset = row_ptr[seq] * num_heads * head_dim;
      const Prefix prefix{prefix_out, prefix_lse, seq, num_seqs * group};
      Readahead readahead;
      if (ahead < num_seqs) {
        const int64_t next_seq = order[ahead], next_first = attended_from(len_ptr[next_seq]);
        const int64_t first_block = next_first / block_size;
        readahead = Readahead{reinterpret_cast<const char*>(k_ptr), reinterpret_cast<const char*>(v_ptr),
                              bt_ptr + next_seq * max_blocks + first_block, block_bytes,
                              (len_ptr[next_seq] - first_block * block_size) * row_bytes};
        // Spread over every row this sequence reads: all of it by the end.
        const int64_t rows_read = passes * (len - first), lines = (readahead.bytes + 63) / 64;
        readahead.rate = (lines << 16) / rows_read + 1;
      }
      const SeqLayout layout{bt_ptr + seq * max_blocks,
                             first,
                             len,
                             block_size,
                             block_stride,
                             num_kv_heads * head_dim,
                             ahead < num_seqs ? &readahead : nullptr};
      if constexpr (std::is_same_v<scalar_t, float>)
        decode_sequence_f32<kChunks>(q_ptr + q_offset, k_ptr, v_ptr, layout, num_kv_heads, group,
                                     static_cast<float>(scale), prefix, scores, work, o_ptr + row_offset);
      else
        decode_sequence_by_head<scalar_t, kChunks>(q_ptr + q_offset, k_ptr, v_ptr, layout, num_kv_heads, group,
                                                   static_cast<float>(scale), prefix, scores, o_ptr + row_offset);
      n = read_ahead ? ahead : next++;
    }
  });
}

template <typename scalar_t>
void dispatch_head_dim(const torch::Tensor& query, const torch::Tensor& key_cache,
                       const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                       torch::Tensor& out, double scale, int64_t sliding_window, int64_t prefix_len,
                       const float* prefix_out, const float* prefix_lse) {
  switch (query.size(2) / kLanes) {
#define PAGODA_CHUNKS(n)                                                                      \
  case n:                                                                                     \
    return decode_kernel<scalar_t, n>(query, key_cache, value_cache, block_tables, seq_lens, \
                                      query_rows, out, scale, sliding_window, prefix_len,     \
                                      prefix_out, prefix_lse);
    PAGODA_CHUNKS(1) PAGODA_CHUNKS(2) PAGODA_CHUNKS(4) PAGODA_CHUNKS(8) PAGODA_CHUNKS(16)
#undef PAGODA_CHUNKS
    default:
      TORCH_CHECK(false, "paged_attention_decode: head_dim ", query.size(2), " is not supported");
  }
}

}  // namespace

bool supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t chunks = head_dim / kLanes;
  return num_heads % num_kv_heads == 0 && head_dim % kLanes == 0 &&
         (chunks == 1 || chunks == 2 || chunks == 4 || chunks == 8 || chunks == 16);
}

// The query layout every attention kernel here takes: [num_tokens, num_heads,
// head_dim] with each row's heads contiguous and the rows at any stride (a view
// of the fused QKV output). Declared in paged_attention_prefill.cpp and
// cascade_prefix.cpp too.
bool query_rows_of_heads(const torch::Tensor& query) {
  return query.dim() == 3 && query.stride(2) == 1 && query.stride(1) == query.size(2);
}

void paged_attention_decode(const torch::Tensor& query, const torch::Tensor& key_cache,
                            const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                            const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                            torch::Tensor& out, double scale, int64_t sliding_window, int64_t prefix_len,
                            const std::optional<torch::Tensor>& prefix_out,
                            const std::optional<torch::Tensor>& prefix_lse) {
  TORCH_CHECK(query_rows_of_heads(query) && out.is_contiguous(),
              "query needs contiguous heads (rows may be strided), out must be contiguous");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32, "block_tables must be int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32, "seq_lens must be int32");
  TORCH_CHECK(query_rows.scalar_type() == torch::kInt64, "query_rows must be int64");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(supports(query.size(1), key_cache.size(2), query.size(2)),
              "paged_attention_decode: unsupported head shape");
  const float* p_out = nullptr;
  const float* p_lse = nullptr;
  if (prefix_len > 0) {
    const int64_t num_seqs = seq_lens.size(0), rows = num_seqs * (query.size(1) / key_cache.size(2));
    TORCH_CHECK(prefix_out.has_value() && prefix_lse.has_value(), "prefix_len needs prefix_out and prefix_lse");
    TORCH_CHECK(sliding_window == 0, "a cascade prefix and a sliding window do not mix");
    TORCH_CHECK(prefix_out->scalar_type() == torch::kFloat && prefix_out->is_contiguous() &&
                    prefix_out->numel() == key_cache.size(2) * rows * query.size(2),
                "prefix_out must be contiguous float32 [num_kv_heads, num_seqs * group, head_dim]");
    TORCH_CHECK(prefix_lse->scalar_type() == torch::kFloat && prefix_lse->is_contiguous() &&
                    prefix_lse->numel() == key_cache.size(2) * rows,
                "prefix_lse must be contiguous float32 [num_kv_heads, num_seqs * group]");
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    for (int64_t s = 0; s < num_seqs; ++s)
      TORCH_CHECK(lens[s] > prefix_len, "sequence ", s, " (", lens[s], " tokens) has no token past the prefix");
    p_out = prefix_out->data_ptr<float>();
    p_lse = prefix_lse->data_ptr<float>();
  }
  switch (query.scalar_type()) {
    case torch::kFloat:
      return dispatch_head_dim<float>(query, key_cache, value_cache, block_tables, seq_lens, query_rows,
                                  out, scale, sliding_window, prefix_len, p_out, p_lse);
    case torch::kBFloat16:
      return dispatch_head_dim<at::BFloat16>(query, key_cache, value_cache, block_tables, seq_lens,
                                         query_rows, out, scale, sliding_window, prefix_len, p_out, p_lse);
    case torch::kHalf:
      return dispatch_head_dim<at::Half>(query, key_cache, value_cache, block_tables, seq_lens,
                                     query_rows, out, scale, sliding_window, prefix_len, p_out, p_lse);
    default:
      TORCH_CHECK(false, "paged_attention_decode: unsupported dtype ", query.scalar_type());
  }
}

