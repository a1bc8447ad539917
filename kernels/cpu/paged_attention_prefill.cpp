// Paged attention for prefill rows (many new tokens per sequence) on CPU:
// flash-style, K/V read from the paged cache (so a cached prefix or earlier
// chunks cost nothing extra), with an online softmax in fp32. bf16 runs where the
// CPU has native bf16 products (AMX or AVX512-BF16; flash_tile.h), float32 on
// any x86 build (flash_tile_f32.h).
//
// bf16 in two passes on ATen's threads:
//   1. pack: each (sequence, kv head)'s context once, zero-padded to 32 keys:
//      K rows contiguous ([chunk][32 keys][head_dim]) and V transposed
//      ([chunk][head_dim][32 keys]);
//   2. attend: (sequence, query head, up to 64 query rows) items, handed out
//      through an atomic counter, because this machine's cores run at uneven
//      speeds and static halves leave one waiting: one (sequence, KV head)'s
//      items at a time, longest first within it (work_items).
// float32 skips the packing (its tiles read cache rows as they are) and attends
// the same items, longest first across all of them.
//
// Shapes:
//   query, out:        [num_tokens, num_heads, head_dim] bf16 or float32; query's rows may be
//                      strided (a view of the fused QKV output), out is contiguous
//   key/value_cache:   [num_blocks, block_size, num_kv_heads, head_dim], query's dtype,
//                      or bf16/half under a float32 query (kv_half.h)
//   block_tables:      [num_seqs, max_num_blocks] int32 (prefill sequences only)
//   seq_lens:          [num_seqs] int32, context length including the new rows
//   query_ranges:      [num_seqs, 2] int64, each sequence's rows [first, end) in query
// The plain-PyTorch twin is kernels/paged_attention_reference.py.
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "flash_tile_pair.h"
#include "flash_tile_f32.h"

bool query_rows_of_heads(const torch::Tensor& query);  // paged_attention_decode.cpp

namespace {

constexpr int64_t kItemRows = 64;  // query rows per work item

struct Item {
  int64_t seq, head, first_row, rows, cost;
};

// (sequence, head, up to 64 rows) items, costliest (rows x keys seen) first.
// With `group` (query heads per KV head), one (sequence, KV head) at a time
// instead, costliest first within it and the costliest such group first: the
// threads then read one packed context while it sits in their L2 (256 KB for
// 1024 keys at head_dim 64) rather than cycling through all of them, and the
// last items handed out are still the cheapest. Ordered by cost alone, the bf16
// kernel (AMX Xeon, family 6 model 167, 4 x 1024 tokens, 9 heads / 3 KV heads;
// three runs of 30-40 alternating calls) took 1.03-1.06x the time.
std::vector<Item> work_items(const int32_t* lens, const int64_t* ranges, int64_t num_seqs, int64_t num_heads,
                             int64_t group = 0) {
  std::vector<Item> items;
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t r = ranges[2 * s]; r < ranges[2 * s + 1]; r += kItemRows) {
      const int64_t rows = std::min<int64_t>(kItemRows, ranges[2 * s + 1] - r);
      const int64_t end_pos = lens[s] - (ranges[2 * s + 1] - r) + rows;  // keys seen by the last row
      for (int64_t h = 0; h < num_heads; ++h) items.push_back({s, h, r, rows, rows * end_pos});
    }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  if (group > 0) {
    const int64_t kv_heads = num_heads / group;
    auto key = [&](const Item& it) { return it.seq * kv_heads + it.head / group; };
    std::vector<int64_t> total(num_seqs * kv_heads, 0);
    for (const Item& it : items) total[key(it)] += it.cost;
    std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
      const int64_t ka = key(a), kb = key(b);
      return total[ka] != total[kb] ? total[ka] > total[kb] : ka < kb;
    });
  }
  return items;
}

template <typename cache_t>
void prefill_f32(const torch::Tensor& query, const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                 const torch::Tensor& block_tables, const int32_t* lens, const int64_t* ranges, int64_t num_seqs,
                 torch::Tensor& out, float scale, int64_t window) {
  const int64_t num_heads = query.size(1), d = query.size(2), num_kv_heads = key_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, row_stride = num_heads * d, q_stride = query.stride(0);
  // A half cache: one (sequence, KV head)'s items at a time, so a thread widens
  // each context it meets once (WidenedContext).
  constexpr bool kHalf = !std::is_same_v<cache_t, float>;
  const std::vector<Item> items = work_items(lens, ranges, num_seqs, num_heads, kHalf ? group : 0);
  std::atomic<int64_t> next{0};
  const float* q = query.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    WidenedContext wide;
    for (int64_t n = next++; n < static_cast<int64_t>(items.size()); n = next++) {
      const Item& it = items[n];
      const F32Context<cache_t> cache_ctx{key_cache.data_ptr<cache_t>(), value_cache.data_ptr<cache_t>(),
                                          block_tables.data_ptr<int32_t>() + it.seq * block_tables.size(1),
                                          lens[it.seq], it.head / group, key_cache.size(1), num_kv_heads, d};
      const F32Context<float> ctx = wide.get(cache_ctx, it.seq * num_kv_heads + it.head / group);
      const int64_t first_pos = lens[it.seq] - (ranges[2 * it.seq + 1] - it.first_row);
      for (int64_t t = 0; t < it.rows; t += kF32TileRows) {
        const int64_t row = it.first_row + t;
        attend_tile_f32(q + row * q_stride + it.head * d, q_stride,
                        static_cast<int>(std::min<int64_t>(kF32TileRows, it.rows - t)), first_pos + t, 1, ctx,
                        scale, window, o + row * row_stride + it.head * d, row_stride);
      }
    }
  });
}

}  // namespace

bool prefill_supported(int64_t head_dim, bool bf16) {
  if (!bf16) return head_dim % 8 == 0 && head_dim <= kF32MaxDim;
#ifdef PAGODA_PREFILL
  return head_dim % 64 == 0 && head_dim <= 256;
#else
  return false;
#endif
}

void paged_attention_prefill(const torch::Tensor& query, const torch::Tensor& key_cache,
                             const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                             const torch::Tensor& seq_lens, const torch::Tensor& query_ranges,
                             torch::Tensor& out, double scale, int64_t sliding_window) {
  const bool bf16 = query.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16 || query.scalar_type() == torch::kFloat) && out.scalar_type() == query.scalar_type() &&
                  value_cache.scalar_type() == key_cache.scalar_type() &&
                  cache_serves(query.scalar_type(), key_cache.scalar_type()),
              "paged_attention_prefill takes bf16 or float32, the same for query, caches and out (or bf16/half "
              "caches under a float32 query)");
  TORCH_CHECK(query_rows_of_heads(query) && out.is_contiguous(),
              "query needs contiguous heads (rows may be strided), out must be contiguous");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  // The flash tiles take a chunk's max over raw scores (max(s c) = c max(s)).
  TORCH_CHECK(scale > 0, "the attention scale must be positive, got ", scale);
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "block_tables must be contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32, "seq_lens must be int32");
  TORCH_CHECK(query_ranges.scalar_type() == torch::kInt64 && query_ranges.is_contiguous() &&
                  query_ranges.dim() == 2 && query_ranges.size(1) == 2 && query_ranges.size(0) == seq_lens.size(0),
              "query_ranges must be contiguous int64 [num_seqs, 2]");
  TORCH_CHECK(prefill_supported(query.size(2), bf16), "paged_attention_prefill: ", bf16 ? "AVX512-BF16 or " : "",
              "head_dim ", query.size(2), " unsupported");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  const int64_t num_seqs = seq_lens.size(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t* ranges = query_ranges.data_ptr<int64_t>();
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t num_new = ranges[2 * s + 1] - ranges[2 * s];
    TORCH_CHECK(num_new >= 1 && num_new <= lens[s], "sequence ", s, " has ", num_new, " new rows of ", lens[s]);
    TORCH_CHECK(ranges[2 * s] >= 0 && ranges[2 * s + 1] <= query.size(0), "sequence ", s, "'s rows are out of range");
    TORCH_CHECK((lens[s] + key_cache.size(1) - 1) / key_cache.size(1) <= block_tables.size(1),
                "block table too short");
  }
  if (!bf16) {
    return with_f32_cache_type(key_cache.scalar_type(), [&](auto element) {
      prefill_f32<decltype(element)>(query, key_cache, value_cache, block_tables, lens, ranges, num_seqs, out,
                                     static_cast<float>(scale), sliding_window);
    });
  }
#ifdef PAGODA_PREFILL
  Layout lay{query.size(2), query.size(1), key_cache.size(2), key_cache.size(1), kChunk * query.size(2)};
  const int64_t group = lay.num_heads / lay.num_kv_heads;
  std::vector<int64_t> chunk_base(num_seqs + 1, 0);
  for (int64_t s = 0; s < num_seqs; ++s) chunk_base[s + 1] = chunk_base[s] + (lens[s] + kChunk - 1) / kChunk;
  // [kv head][chunk] of packed words: K then V.
  const int64_t chunks = chunk_base[num_seqs];
  // Kept between calls (one per layer per step): a fresh multi-MB buffer each
  // time would go back to the OS and fault its pages in again.
  static LineBuffer k_scratch, v_scratch;
  static std::mutex scratch_mutex;  // two engines in one process must not share it mid-call
  std::lock_guard<std::mutex> lock(scratch_mutex);
  const size_t packed_elems = static_cast<size_t>(lay.num_kv_heads * chunks * lay.chunk_elems);
  uint16_t* const k_packed = k_scratch.get(packed_elems);
  uint16_t* const v_packed = v_scratch.get(packed_elems);
  const auto* kc = reinterpret_cast<const uint16_t*>(key_cache.data_ptr());
  const auto* vc = reinterpret_cast<const uint16_t*>(value_cache.data_ptr());
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  at::parallel_for(0, num_seqs * lay.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = t / lay.num_kv_heads, h = t % lay.num_kv_heads;
      const int64_t base = h * chunks + chunk_base[s];
      pack_context(kc, vc, tables + s * block_tables.size(1), lens[s], h, lay,
                   k_packed + base * lay.chunk_elems, v_packed + base * lay.chunk_elems);
    }
  });

  const std::vector<Item> items = work_items(lens, ranges, num_seqs, lay.num_heads, group);
  std::atomic<int64_t> next{0};
  const auto* q = reinterpret_cast<const uint16_t*>(query.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t row_stride = lay.num_heads * lay.head_dim, q_stride = query.stride(0);
  const float fscale = static_cast<float>(scale);
  const bool amx = use_amx();
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    auto work = [&](auto amx_tag) {
      constexpr bool kAmx = decltype(amx_tag)::value;
      for (int64_t n = next++; n < static_cast<int64_t>(items.size()); n = next++) {
        const Item& it = items[n];
        const int64_t kv = it.head / group, base = kv * chunks + chunk_base[it.seq];
        const int64_t first_pos = lens[it.seq] - (ranges[2 * it.seq + 1] - it.first_row);
        const int64_t step = tile_rows(kAmx, sliding_window);
        for (int64_t t = 0; t < it.rows; t += step) {
          const int64_t row = it.first_row + t;
          attend_rows<kAmx>(q + row * q_stride + it.head * lay.head_dim, q_stride,
                            static_cast<int>(std::min<int64_t>(step, it.rows - t)), first_pos + t, 1,
                            k_packed + base * lay.chunk_elems, v_packed + base * lay.chunk_elems,
                            lay, fscale, sliding_window, o + row * row_stride + it.head * lay.head_dim, row_stride);
        }
      }
    };
    if (amx)
      with_tiles<true>([&] { work(std::true_type{}); });
    else
      with_tiles<false>([&] { work(std::false_type{}); });
  });
#else
  (void)key_cache, (void)value_cache, (void)block_tables, (void)out, (void)scale, (void)sliding_window;
#endif
}
