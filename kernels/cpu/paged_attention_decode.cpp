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
//   query, out:          [num_tokens, num_heads, head_dim]   (rows picked by query_rows)
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

#include "vec16.h"

namespace {

#ifdef __AVX512BF16__
constexpr bool kBf16Dot = true;

// 16 lanes of partial sums of q . k over `kPairs` x 32 bf16 (sum them for the dot).
template <int kPairs>
inline vec16 pair_dot(const at::BFloat16* q, const at::BFloat16* k) {
  __m512 d = _mm512_setzero_ps();
  for (int c = 0; c < kPairs; ++c)
    d = _mm512_dpbf16_ps(d, (__m512bh)_mm512_loadu_si512(q + c * 32), (__m512bh)_mm512_loadu_si512(k + c * 32));
  return reinterpret_cast<vec16>(d);
}
#else
constexpr bool kBf16Dot = false;

template <int kPairs>
inline vec16 pair_dot(const at::BFloat16*, const at::BFloat16*) { return vec16{}; }
#endif

// Blocks are scattered, and the hardware prefetcher stops at page boundaries:
// while reading row i of one block, ask for row i of the block after next
// (kPrefetchBlocks ahead). With KV cold in DRAM, as in a real step (30 layers
// of 32 x 96 tokens, blocks of 8): one block ahead took 139-162 us per layer,
// two 124-150 (four: 161-172, too far for short sequences).
constexpr int64_t kPrefetchBlocks = 2;

template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t row_elems) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = row_elems * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
}

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

// A cascade's prefix half for one sequence (out == nullptr: none): its rows in
// attention_over_prefix's [kv head][seq * group + g] layout.
struct Prefix {
  const float* out = nullptr;
  const float* lse = nullptr;
  int64_t seq = 0, rows = 0;  // this sequence, and rows per kv head (num_seqs * group)
  int64_t row(int head, int group) const { return (head / group) * rows + seq * group + head % group; }
};

// One sequence: every KV head, reading each token's whole K (then V) row once,
// contiguously, so the hardware prefetcher streams the blocks.
template <typename scalar_t, int kChunks>
void decode_sequence(const scalar_t* q_row, const scalar_t* k_base, const scalar_t* v_base,
                     const int32_t* table, int64_t first, int64_t len, int64_t block_size,
                     int64_t block_stride, int num_kv_heads, int group, float scale,
                     const Prefix& prefix, std::vector<float>& scores, std::vector<vec16>& work,
                     scalar_t* o_row) {
  const int num_heads = num_kv_heads * group;
  const int64_t span = len - first;
  const int64_t token_stride = static_cast<int64_t>(num_kv_heads) * kChunks * kLanes;
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
  // bf16 with AVX512-BF16: q . k in bf16 pairs straight from the cache rows
  // (exact products, fp32 sums), no widening; the scale comes after.
  constexpr bool kPairDots = kBf16Dot && std::is_same_v<scalar_t, at::BFloat16> && kChunks % 2 == 0;
  const float dot_scale = kPairDots ? scale : 1.f;
  auto flush = [&](int64_t t_end) {
    const int64_t offset = t_end - pending - first;
    for (int head = 0; head < num_heads; ++head) {
      float* s = scores.data() + head * span + offset;
      const vec16* d = dots + head * kLanes;
      if (pending == kLanes) {
        sum16_store(d, dot_scale, s);
      } else {
        for (int64_t i = 0; i < pending; ++i) s[i] = sum(d[i]) * dot_scale;
      }
    }
    pending = 0;
  };
  for (int64_t t = first; t < len;) {
    const int64_t block_end = std::min(len, (t / block_size + 1) * block_size);
    const scalar_t* k = k_base + table[t / block_size] * block_stride + (t % block_size) * token_stride;
    const int64_t next_block = t / block_size + kPrefetchBlocks;
    const scalar_t* k_next = next_block * block_size < len
                                 ? k_base + table[next_block] * block_stride + (t % block_size) * token_stride
                                 : nullptr;
    for (; t < block_end; ++t, k += token_stride) {
      if (k_next != nullptr) {
        prefetch_row(k_next, token_stride);
        k_next += token_stride;
      }
      for (int h = 0; h < num_kv_heads; ++h) {
        if constexpr (std::is_same_v<scalar_t, float>) {
          float_dots<kChunks>(reinterpret_cast<const float*>(q), k, h, group, pending,
                              reinterpret_cast<float*>(dots));
        } else if constexpr (kPairDots) {
          for (int g = 0; g < group; ++g) {
            const int head = h * group + g;
            dots[head * kLanes + pending] = pair_dot<kChunks / 2>(q_row + head * kChunks * kLanes,
                                                                  k + h * kChunks * kLanes);
          }
        } else {
          vec16 kv[kChunks];
          for (int c = 0; c < kChunks; ++c) kv[c] = load(k + (h * kChunks + c) * kLanes);
          for (int g = 0; g < group; ++g) {
            const vec16* qh = q + (h * group + g) * kChunks;
            vec16 dot = qh[0] * kv[0];
            for (int c = 1; c < kChunks; ++c) dot += qh[c] * kv[c];
            dots[(h * group + g) * kLanes + pending] = dot;
          }
        }
      }
      if (++pending == kLanes) flush(t + 1);
    }
  }
  if (pending > 0) flush(len);
  // Softmax per query head (normalised at the end, where a cascade's prefix half
  // joins: weights[head] for this part's sums, prefix_weights[head] for it).
  std::vector<float> weights(num_heads), prefix_weights(num_heads, 0.f);
  for (int head = 0; head < num_heads; ++head) {
    float* s = scores.data() + head * span;
    const float m = max_of(s, span);
    vnative totals = {};
    int64_t i = 0;
    for (; i + kNativeLanes <= span; i += kNativeLanes) {
      const vnative e = exp_native(load_native(s + i) - m);
      store_native(s + i, e);
      totals += e;
    }
    float total = sum_native(totals);
    for (; i < span; ++i) {
      s[i] = std::exp(s[i] - m);
      total += s[i];
    }
    if (prefix.out == nullptr) {
      weights[head] = 1.f / total;
      continue;
    }
    // Both halves as exp(lse - top): this one's sums carry exp(m).
    const float lse_p = prefix.lse[prefix.row(head, group)];
    const float top = std::max(m, lse_p);
    const float w_s = std::exp(m - top), w_p = std::exp(lse_p - top);
    const float inv = 1.f / (total * w_s + w_p);
    weights[head] = w_s * inv;
    prefix_weights[head] = w_p * inv;
  }
  // Pass 2: out_head = sum_t p[head, t] v_t
  for (int64_t t = first; t < len;) {
    const int64_t block_end = std::min(len, (t / block_size + 1) * block_size);
    const scalar_t* v = v_base + table[t / block_size] * block_stride + (t % block_size) * token_stride;
    const int64_t next_block = t / block_size + kPrefetchBlocks;
    const scalar_t* v_next = next_block * block_size < len
                                 ? v_base + table[next_block] * block_stride + (t % block_size) * token_stride
                                 : nullptr;
    for (; t < block_end; ++t, v += token_stride) {
      if (v_next != nullptr) {
        prefetch_row(v_next, token_stride);
        v_next += token_stride;
      }
      for (int h = 0; h < num_kv_heads; ++h) {
        if constexpr (std::is_same_v<scalar_t, float>) {
          float_weighted_sum<kChunks>(scores.data() + t - first, span, v, h, group,
                                      reinterpret_cast<float*>(acc));
          continue;
        }
        vec16 vv[kChunks];
        for (int c = 0; c < kChunks; ++c) vv[c] = load(v + (h * kChunks + c) * kLanes);
        for (int g = 0; g < group; ++g) {
          const float p = scores[(h * group + g) * span + (t - first)];
          vec16* a = acc + (h * group + g) * kChunks;
          for (int c = 0; c < kChunks; ++c) a[c] += p * vv[c];
        }
      }
    }
  }
  for (int head = 0; head < num_heads; ++head) {
    const float* p = prefix.out != nullptr ? prefix.out + prefix.row(head, group) * kChunks * kLanes : nullptr;
    for (int c = 0; c < kChunks; ++c)
      for (int i = 0; i < kLanes; ++i) {
        float o = acc[head * kChunks + c][i] * weights[head];
        if (p != nullptr) o += p[c * kLanes + i] * prefix_weights[head];
        o_row[(head * kChunks + c) * kLanes + i] = static_cast<scalar_t>(o);
      }
  }
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
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(num_seqs, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<vec16> work;
    for (int64_t n = next++; n < num_seqs; n = next++) {
      const int64_t seq = order[n];
      const int64_t len = len_ptr[seq];
      const int64_t window_first = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const int64_t row_offset = row_ptr[seq] * num_heads * head_dim;
      const Prefix prefix{prefix_out, prefix_lse, seq, num_seqs * group};
      decode_sequence<scalar_t, kChunks>(
          q_ptr + row_offset, k_ptr, v_ptr, bt_ptr + seq * max_blocks, std::max(window_first, prefix_len), len,
          block_size, block_stride, num_kv_heads, group, static_cast<float>(scale), prefix, scores, work,
          o_ptr + row_offset);
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

void paged_attention_decode(const torch::Tensor& query, const torch::Tensor& key_cache,
                            const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                            const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                            torch::Tensor& out, double scale, int64_t sliding_window, int64_t prefix_len,
                            const std::optional<torch::Tensor>& prefix_out,
                            const std::optional<torch::Tensor>& prefix_lse) {
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous(), "query and out must be contiguous");
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

