// The shared-prefix half of cascade attention for decode rows: bf16 on CPUs with
// AMX or AVX512-BF16 (flash_tile.h), float32 on any x86 build (flash_tile_f32.h).
//
// When every decode sequence of a step starts with the same cached blocks (a
// shared system prompt, a few-shot prefix, n samples of one prompt), per-sequence
// decode attention reads those blocks once per sequence. Here all the decode
// queries attend to the prefix together instead: the prefix is packed once per KV
// head and the queries of a GQA group of every sequence form the rows of the
// flash tiles of flash_tile.h, so the prefix's K/V are read once per step and the
// work is tile products instead of per-row dot products. The decode kernel then
// attends each sequence's own tokens and merges both halves by their
// log-sum-exp (paged_attention_decode's prefix arguments).
//
// Shapes:
//   query:            [num_tokens, num_heads, head_dim] bf16 or float32 (rows may be strided); decode rows
//                     picked by query_rows
//   key/value_cache:  [num_blocks, block_size, num_kv_heads, head_dim], query's dtype, or
//                     bf16/half under a float32 query (kv_half.h)
//   prefix_table:     [>= prefix_len / block_size] int32, the blocks every sequence starts with
//   query_rows:       [num_seqs] int64
//   out:              [num_kv_heads, num_seqs * group, head_dim] float32: row seq * group + g
//                     of KV head h is query head h * group + g of sequence seq, normalised
//                     over the prefix alone
//   lse:              [num_kv_heads, num_seqs * group] float32, log-sum-exp of those rows'
//                     scaled scores over the prefix
// The plain-PyTorch twin: kernels/paged_attention_reference.py over the whole context.
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "flash_tile_pair.h"
#include "flash_tile_f32.h"

bool prefill_supported(int64_t head_dim, bool bf16);  // paged_attention_prefill.cpp: this build and CPU run the tiles
bool query_rows_of_heads(const torch::Tensor& query);  // paged_attention_decode.cpp

namespace {

// Each sequence's GQA group of query heads, gathered per KV head:
// q [num_tokens, num_heads, d] rows qrows -> out [kv head][seq * group + g][d].
template <typename T>
void gather_group_rows(const T* q, int64_t q_stride, const int64_t* qrows, int64_t num_seqs, int64_t num_heads,
                       int64_t num_kv_heads, int64_t d, T* out) {
  const int64_t group = num_heads / num_kv_heads, rows = num_seqs * group;
  for (int64_t h = 0; h < num_kv_heads; ++h)
    for (int64_t s = 0; s < num_seqs; ++s)
      std::memcpy(out + (h * rows + s * group) * d, q + qrows[s] * q_stride + h * group * d, group * d * sizeof(T));
}

template <typename cache_t>
void prefix_f32(const torch::Tensor& query, const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                const int32_t* table, int64_t prefix_len, const int64_t* qrows, int64_t num_seqs, float* o,
                float* l, float scale) {
  const int64_t num_heads = query.size(1), d = query.size(2), num_kv_heads = key_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, rows = num_seqs * group;
  static std::vector<float> q_rows;  // [kv head][seq * group + g][head_dim]
  static std::mutex scratch_mutex;
  std::lock_guard<std::mutex> lock(scratch_mutex);
  if (q_rows.size() < static_cast<size_t>(num_kv_heads * rows * d)) q_rows.resize(num_kv_heads * rows * d);
  gather_group_rows(query.data_ptr<float>(), query.stride(0), qrows, num_seqs, num_heads, num_kv_heads, d, q_rows.data());
  const int64_t tiles = (rows + kF32TileRows - 1) / kF32TileRows;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    WidenedContext wide;  // a half cache: the prefix of each KV head a thread meets, widened once
    for (int64_t n = next++; n < num_kv_heads * tiles; n = next++) {
      const int64_t h = n / tiles, first = h * rows + (n % tiles) * kF32TileRows;
      const int count = static_cast<int>(std::min<int64_t>(kF32TileRows, (h + 1) * rows - first));
      const F32Context<cache_t> cache_ctx{key_cache.data_ptr<cache_t>(), value_cache.data_ptr<cache_t>(), table,
                                          prefix_len, h, key_cache.size(1), num_kv_heads, d};
      const F32Context<float> ctx = wide.get(cache_ctx, h);
      attend_tile_f32(q_rows.data() + first * d, d, count, prefix_len - 1, 0, ctx, scale, 0, o + first * d, d,
                      l + first);
    }
  });
}

}  // namespace

void attention_over_prefix(const torch::Tensor& query, const torch::Tensor& key_cache,
                           const torch::Tensor& value_cache, const torch::Tensor& prefix_table,
                           int64_t prefix_len, const torch::Tensor& query_rows, torch::Tensor& out,
                           torch::Tensor& lse, double scale) {
  const bool bf16 = query.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16 || query.scalar_type() == torch::kFloat) && value_cache.scalar_type() == key_cache.scalar_type() &&
                  cache_serves(query.scalar_type(), key_cache.scalar_type()),
              "attention_over_prefix takes bf16 or float32, the same for query and caches (or bf16/half caches "
              "under a float32 query)");
  TORCH_CHECK(query_rows_of_heads(query) && key_cache.is_contiguous() && value_cache.is_contiguous(),
              "query needs contiguous heads (rows may be strided), caches must be contiguous");
  TORCH_CHECK(prefix_table.scalar_type() == torch::kInt32 && prefix_table.is_contiguous(),
              "prefix_table must be contiguous int32");
  TORCH_CHECK(query_rows.scalar_type() == torch::kInt64 && query_rows.is_contiguous(),
              "query_rows must be contiguous int64");
  const int64_t num_seqs = query_rows.size(0), num_heads = query.size(1), d = query.size(2);
  const int64_t num_kv_heads = key_cache.size(2), block_size = key_cache.size(1);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  // The flash tiles take a chunk's max over raw scores (max(s c) = c max(s)).
  TORCH_CHECK(scale > 0, "the attention scale must be positive, got ", scale);
  const int64_t group = num_heads / num_kv_heads, rows = num_seqs * group;
  TORCH_CHECK(prefix_len >= 1 && (prefix_len + block_size - 1) / block_size <= prefix_table.size(0),
              "prefix_len ", prefix_len, " needs more blocks than prefix_table holds");
  TORCH_CHECK(out.scalar_type() == torch::kFloat && out.is_contiguous() && out.numel() == num_kv_heads * rows * d,
              "out must be contiguous float32 [num_kv_heads, num_seqs * group, head_dim]");
  TORCH_CHECK(lse.scalar_type() == torch::kFloat && lse.is_contiguous() && lse.numel() == num_kv_heads * rows,
              "lse must be contiguous float32 [num_kv_heads, num_seqs * group]");
  TORCH_CHECK(prefill_supported(d, bf16), "attention_over_prefix: ", bf16 ? "AVX512-BF16 or " : "", "head_dim ", d,
              " unsupported");
  const int64_t* qrows = query_rows.data_ptr<int64_t>();
  for (int64_t s = 0; s < num_seqs; ++s)
    TORCH_CHECK(qrows[s] >= 0 && qrows[s] < query.size(0), "query row ", qrows[s], " out of range");
  if (!bf16) {
    return with_f32_cache_type(key_cache.scalar_type(), [&](auto element) {
      prefix_f32<decltype(element)>(query, key_cache, value_cache, prefix_table.data_ptr<int32_t>(), prefix_len,
                                    qrows, num_seqs, out.data_ptr<float>(), lse.data_ptr<float>(),
                                    static_cast<float>(scale));
    });
  }
#ifdef PAGODA_PREFILL
  Layout lay{d, num_heads, num_kv_heads, block_size, kChunk * d};
  const int64_t chunks = (prefix_len + kChunk - 1) / kChunk;
  // The queries gathered per KV head, [kv head][seq * group + g][head_dim], kept
  // between calls as the prefill kernel's scratch is.
  static std::vector<uint16_t> q_rows;
  static std::mutex scratch_mutex;
  std::lock_guard<std::mutex> lock(scratch_mutex);
  if (q_rows.size() < static_cast<size_t>(num_kv_heads * rows * d)) q_rows.resize(num_kv_heads * rows * d);
  gather_group_rows(reinterpret_cast<const uint16_t*>(query.data_ptr()), query.stride(0), qrows, num_seqs, num_heads, num_kv_heads, d,
                    q_rows.data());
  const auto* kc = reinterpret_cast<const uint16_t*>(key_cache.data_ptr());
  const auto* vc = reinterpret_cast<const uint16_t*>(value_cache.data_ptr());
  // Items: (kv head, 16 or 32 rows: tile_rows), all the same length, split into one contiguous
  // run per thread. Each thread packs the KV heads its run meets into its own
  // buffer and reads them from its own L2. One shared packed copy, packed by
  // (head, chunk) across threads and then read by whichever thread took a tile,
  // sent most lines from core to core twice a call (and the next call's packing
  // took them back): on a Zen 4 under KVM, 32 rows x 9 heads over a 512-token
  // prefix cost 144 us per layer, and 235 while the two vCPUs sat far apart on
  // the host, of which the packing alone was 27 and 103 us.
  const bool amx = use_amx();
  const int64_t tile = tile_rows(amx, 0);
  const int64_t tiles = (rows + tile - 1) / tile, items = num_kv_heads * tiles;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  float* o = out.data_ptr<float>();
  float* l = lse.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  const int32_t* table = prefix_table.data_ptr<int32_t>();
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    thread_local LineBuffer k_scratch, v_scratch;  // one KV head's packed prefix
    uint16_t* const k_own = k_scratch.get(chunks * lay.chunk_elems);
    uint16_t* const v_own = v_scratch.get(chunks * lay.chunk_elems);
    auto work = [&](auto amx_tag) {
      constexpr bool kAmx = decltype(amx_tag)::value;
      for (int64_t t = t0; t < t1; ++t) {
        int64_t packed = -1;  // the KV head in k_own / v_own
        for (int64_t n = items * t / threads; n < items * (t + 1) / threads; ++n) {
          const int64_t h = n / tiles, first = h * rows + (n % tiles) * tile;
          if (h != packed) {
            pack_context(kc, vc, table, prefix_len, h, lay, k_own, v_own);
            packed = h;
          }
          const int count = static_cast<int>(std::min<int64_t>(tile, (h + 1) * rows - first));
          // Every row at position prefix_len - 1: all prefix keys, none of the padding.
          attend_rows<kAmx, float>(q_rows.data() + first * d, d, count, prefix_len - 1, 0, k_own,
                                   v_own, lay, fscale, 0, o + first * d, d, l + first);
        }
      }
    };
    if (amx)
      with_tiles<true>([&] { work(std::true_type{}); });
    else
      with_tiles<false>([&] { work(std::false_type{}); });
  });
#endif
}
