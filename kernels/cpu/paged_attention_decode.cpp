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
//   key/value_cache:     [num_blocks, block_size, num_kv_heads, head_dim], query's dtype;
//                        or bf16/half under a float32 query (kv_half.h)
//   block_tables:        [num_seqs, max_num_blocks] int32
//   seq_lens, query_rows:[num_seqs] int32 / int64
//   prefix_out, prefix_lse (cascade, optional): [num_kv_heads, num_seqs * group,
//                        head_dim] / [num_kv_heads, num_seqs * group] float32, the
//                        attention over the first prefix_len tokens
//                        (cascade_prefix.cpp); this kernel then attends tokens
//                        [prefix_len, seq_len) and merges the two by log-sum-exp.
//
// The plain-PyTorch twin is kernels/paged_attention_reference.py.
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "decode_head_tile.h"
#include "kv_half.h"
#include "vec16.h"

namespace {

// float32 at the CPU's own vector width (8 lanes on AVX2, where GCC moved each
// 16-lane dot through the stack on its way to `dots`: 5 GB/s). Each dot entry
// is 16 floats whose total is the dot product: with 8-lane vectors, two
// accumulators fill its halves.
constexpr int kDotVectors = kLanes / kNativeLanes;

// dots[head, pending] for the `group` query heads of KV head h, against key row k
// (float32, or a half cache's row widened as it loads).
template <int kChunks, typename cache_t>
inline void float_dots(const float* q, const cache_t* k, int h, int group, int64_t pending, float* dots) {
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
template <int kChunks, typename cache_t>
inline void float_weighted_sum(const float* scores, int64_t span, const cache_t* v, int h, int group,
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

// Pass 2 over a run of up to kRunTokens consecutive tokens' V rows (the first at
// span offset j0): acc[head] += sum_i p[head, j0 + i] v_i for every query head,
// the KV heads' groups of G. All heads' accumulators are num_heads x head_dim
// floats (SmolLM2's 9 x 64: 72 AVX2 registers' worth), so float_weighted_sum
// adds each token into memory, a load and a store per FMA; here each KV head's
// G heads keep a slice of kSlice native vectors of their accumulators in
// registers through the run (G x kSlice of them, the slice of V and a
// broadcast score within the register file), and accumulators move once per run.
// Over a half cache only: a run reads each of its rows in slices, one (head,
// slice) at a time, and float32 rows (12 lines each for SmolLM2) then came from
// DRAM at 1.15-1.19x the token-by-token time (emulated AVX2 on a Zen 4, 16-64
// sequences; 0.95x with the KV in cache), where bf16 rows (6 lines) took 0.96x
// (0.90x in cache).
constexpr int kRunTokens = 16;
constexpr int kRegisters = kNativeLanes == 8 ? 16 : 32;

template <int G, int kPieces>
constexpr int slice_vectors() {
  int v = 1;
  while (2 * v <= kPieces && (2 * v) * (G + 1) + 1 <= kRegisters) v *= 2;
  return v;
}

template <int kChunks, int G, typename cache_t>
inline void float_weighted_rows(const float* scores, int64_t span, int64_t j0, const cache_t* const* rows, int n,
                                int num_kv_heads, float* acc) {
  constexpr int W = kNativeLanes, kPieces = kChunks * kLanes / W, kSlice = slice_vectors<G, kPieces>();
  for (int h = 0; h < num_kv_heads; ++h)
    for (int c = 0; c < kPieces; c += kSlice) {
      vnative a[G][kSlice];
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < kSlice; ++j) a[g][j] = load_native(acc + ((h * G + g) * kPieces + c + j) * W);
      const float* p = scores + h * G * span + j0;
      for (int i = 0; i < n; ++i) {
        vnative v[kSlice];
        for (int j = 0; j < kSlice; ++j) v[j] = load_native(rows[i] + (h * kPieces + c + j) * W);
        for (int g = 0; g < G; ++g) {
          const float w = p[g * span + i];
          for (int j = 0; j < kSlice; ++j) a[g][j] += w * v[j];
        }
      }
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < kSlice; ++j) store_native(acc + ((h * G + g) * kPieces + c + j) * W, a[g][j]);
    }
}

// One float32 sequence: every KV head per token, reading each token's whole K
// (then V) row once, contiguously; the cache float32 or half (kv_half.h). (bf16
// and half models go KV head by KV head: decode_head_tile.h.)
template <int kChunks, typename cache_t>
void decode_sequence_f32(const float* q_row, const cache_t* k_base, const cache_t* v_base, const SeqLayout& s,
                         int num_kv_heads, int group, float scale, const Prefix& prefix,
                         std::vector<float>& scores, std::vector<vec16>& work, float* o_row, float* lse_row) {
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
        sum16_store(d, out);
      } else {
        for (int64_t i = 0; i < pending; ++i) out[i] = sum(d[i]);
      }
    }
    pending = 0;
  };
  for_each_token<kRowPrefetchBlocks>(k_base, s, 0, s.token_stride, [&](const cache_t* k, int64_t t) {
    for (int h = 0; h < num_kv_heads; ++h)
      float_dots<kChunks>(reinterpret_cast<const float*>(q), k, h, group, pending, reinterpret_cast<float*>(dots));
    if (++pending == kLanes) flush(t + 1);
  });
  if (pending > 0) flush(s.len);
  std::vector<PartWeights> weights(num_heads);
  for (int head = 0; head < num_heads; ++head)
    weights[head] = softmax_in_place(scores.data() + head * span, span, prefix, head, group);
  // Pass 2: out_head = sum_t p[head, t] v_t; over a half cache in runs of
  // kRunTokens rows (groups of up to 8 heads), otherwise token by token.
  float* acc_f = reinterpret_cast<float*>(acc);
  auto runs = [&](auto group_tag) {
    constexpr int G = decltype(group_tag)::value;
    const cache_t* rows[kRunTokens];
    int n = 0;
    int64_t j0 = 0;
    for_each_token<kRowPrefetchBlocks>(v_base, s, 0, s.token_stride, [&](const cache_t* v, int64_t t) {
      if (n == 0) j0 = t - s.first;
      rows[n++] = v;
      if (n == kRunTokens) {
        float_weighted_rows<kChunks, G>(scores.data(), span, j0, rows, n, num_kv_heads, acc_f);
        n = 0;
      }
    });
    if (n > 0) float_weighted_rows<kChunks, G>(scores.data(), span, j0, rows, n, num_kv_heads, acc_f);
  };
  auto token_by_token = [&] {
    for_each_token<kRowPrefetchBlocks>(v_base, s, 0, s.token_stride, [&](const cache_t* v, int64_t t) {
      for (int h = 0; h < num_kv_heads; ++h)
        float_weighted_sum<kChunks>(scores.data() + t - s.first, span, v, h, group, acc_f);
    });
  };
  if constexpr (std::is_same_v<cache_t, float>) {
    token_by_token();
  } else {
    switch (group) {
#define PAGODA_GROUP(g)                     \
  case g:                                   \
    runs(std::integral_constant<int, g>{}); \
    break;
      PAGODA_GROUP(1) PAGODA_GROUP(2) PAGODA_GROUP(3) PAGODA_GROUP(4)
      PAGODA_GROUP(5) PAGODA_GROUP(6) PAGODA_GROUP(7) PAGODA_GROUP(8)
#undef PAGODA_GROUP
      default:
        token_by_token();
    }
  }
  for (int head = 0; head < num_heads; ++head) {
    store_head<float, kChunks>(acc + head * kChunks, weights[head], prefix, head, group, o_row);
    if (lse_row != nullptr) lse_row[head] = weights[head].lse;
  }
}

// A sequence is one thread's task, so one long sequence sets a step's time
// while other threads idle (one stream: one sequence of 324 tokens, SmolLM2's
// 9/3 heads of 64, 30 layers, took 0.43 ms on one thread of a 2-core Zen 4, hot
// or cold). Such a sequence's attended tokens go in parts that threads attend
// apart, each part's float32 output and log-sum-exp per head merged by
// merge_parts. Parts of at least kMinPartTokens, at most kMaxParts to a
// sequence. A part costs a parallel task and a merge: one sequence on 2 threads of that Zen 4, hot, per
// call vs one thread's walk: 2 x 64 tokens 1.24x, 2 x 162 0.80x, 2 x 500 0.63x,
// 2 x 2000 0.56x; but one stream's decode step at 300-500 tokens in the engine
// (parts of 150-250) was no faster (per-pair median 1.01, 9 pairs), at 600-800
// 0.98, at 4000 0.87. Cold (30 layers' caches, bench/decode_attention_ab.py), 2
// parts from 2 threads against one: a Zen 5 0.97x at 200 tokens, 0.89x at 300
// (1.16x at 128); an AMX Xeon (family 6 model 167, a core reads 16-22 GB/s)
// 0.82-0.90x at 324. So from 256 tokens (parts of 128+); 512 before.
constexpr int64_t kMinPartTokens = 128, kMaxParts = 16;

// First token attended: past a sliding window's start and a cascade's prefix.
inline int64_t attended_from(int64_t len, int64_t sliding_window, int64_t prefix_len) {
  return std::max(sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0, prefix_len);
}

}  // namespace

// A sequence longer than a thread's share of the step's tokens (one stream; or
// one long context among a few short ones) in span x threads / total (rounded)
// near-equal parts, fewer where a part would fall under kMinPartTokens; parts of
// one sequence adjacent, in token order, every other sequence one part. Empty
// when nothing splits, and from 4 sequences per thread, where the read-ahead
// path runs (each sequence one thread's task).
std::vector<std::tuple<int64_t, int64_t, int64_t>> decode_parts(const int32_t* lens, int64_t num_seqs,
                                                                int64_t threads, int64_t sliding_window) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> parts;
  if (threads < 2 || num_seqs >= 4 * threads) return parts;
  auto span_of = [&](int64_t s) { return lens[s] - attended_from(lens[s], sliding_window, 0); };
  int64_t total = 0;
  for (int64_t s = 0; s < num_seqs; ++s) total += span_of(s);
  auto parts_of = [&](int64_t span) {
    // Threads' worth of this sequence, rounded: ceil'd, of two near-equal
    // sequences on 2 threads the longer went in two parts (three tasks).
    const int64_t share = (2 * span * threads + total) / (2 * total);
    return std::max<int64_t>(1, std::min({kMaxParts, span / kMinPartTokens, share}));
  };
  bool split = false;
  for (int64_t s = 0; s < num_seqs && !split; ++s) split = parts_of(span_of(s)) > 1;
  if (!split) return parts;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t first = attended_from(lens[s], sliding_window, 0), span = lens[s] - first, n = parts_of(span);
    for (int64_t i = 0; i < n; ++i) parts.emplace_back(s, first + span * i / n, first + span * (i + 1) / n);
  }
  return parts;
}

// The same plan for Python (tests): (sequence, first token, end token) per part.
std::vector<std::tuple<int64_t, int64_t, int64_t>> paged_attention_decode_parts(const torch::Tensor& seq_lens,
                                                                                int64_t threads,
                                                                                int64_t sliding_window) {
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.dim() == 1, "seq_lens must be int32 [num_seqs]");
  const torch::Tensor lens = seq_lens.contiguous();
  return decode_parts(lens.data_ptr<int32_t>(), lens.size(0), threads, sliding_window);
}

namespace {

// out row = the parts' outputs weighted by exp(lse - max lse), over their total:
// the softmax over all of a sequence's tokens from the softmaxes of its parts.
template <typename scalar_t>
void merge_parts(const float* part_out, const float* part_lse, int64_t parts, int64_t num_heads,
                 int64_t head_dim, scalar_t* o_row) {
  for (int64_t head = 0; head < num_heads; ++head) {
    float top = -INFINITY;
    for (int64_t p = 0; p < parts; ++p) top = std::max(top, part_lse[p * num_heads + head]);
    float weights[kMaxParts], total = 0.f;
    for (int64_t p = 0; p < parts; ++p) total += weights[p] = std::exp(part_lse[p * num_heads + head] - top);
    for (int64_t d = 0; d < head_dim; ++d) {
      float o = 0.f;
      for (int64_t p = 0; p < parts; ++p) o += weights[p] * part_out[(p * num_heads + head) * head_dim + d];
      o_row[head * head_dim + d] = static_cast<scalar_t>(o / total);
    }
  }
}

// scalar_t: the query's and out's dtype; cache_t: the caches' (scalar_t, or a
// half type under float32).
template <typename scalar_t, typename cache_t, int kChunks>
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
  const cache_t* k_ptr = key_cache.data_ptr<cache_t>();
  const cache_t* v_ptr = value_cache.data_ptr<cache_t>();
  const int32_t* bt_ptr = block_tables.data_ptr<int32_t>();
  const int32_t* len_ptr = seq_lens.data_ptr<int32_t>();
  const int64_t* row_ptr = query_rows.data_ptr<int64_t>();
  scalar_t* o_ptr = out.data_ptr<scalar_t>();

  // One sequence's (or part's) attention: float32 walks whole token rows, 16-bit
  // caches KV head by KV head (decode_head_tile.h). out_t: scalar_t, or float for a part.
  auto attend = [&](const scalar_t* q, const SeqLayout& layout, const Prefix& prefix, std::vector<float>& scores,
                    std::vector<vec16>& work, auto* o, float* lse) {
    if constexpr (std::is_same_v<scalar_t, float>)
      decode_sequence_f32<kChunks, cache_t>(q, k_ptr, v_ptr, layout, num_kv_heads, group, static_cast<float>(scale), prefix,
                                   scores, work, o, lse);
    else if constexpr (std::is_same_v<scalar_t, cache_t>)
      decode_sequence_by_head<scalar_t, kChunks>(q, k_ptr, v_ptr, layout, num_kv_heads, group,
                                                 static_cast<float>(scale), prefix, scores, work, o, lse);
  };

  // Long sequences in parts (decode_parts); a cascade has many sequences and never splits.
  const auto parts = prefix_out == nullptr ? decode_parts(len_ptr, num_seqs, at::get_num_threads(), sliding_window)
                                           : std::vector<std::tuple<int64_t, int64_t, int64_t>>{};
  if (!parts.empty()) {
    // parts x [num_heads, head_dim] outputs and parts x [num_heads] log-sum-exps.
    const int64_t num_parts = static_cast<int64_t>(parts.size()), head_elems = num_heads * head_dim;
    std::vector<float> part_out(num_parts * head_elems), part_lse(num_parts * num_heads);
    // Longest part first through a counter, as sequences go below.
    std::vector<int64_t> by_size(num_parts);
    for (int64_t i = 0; i < num_parts; ++i) by_size[i] = i;
    std::stable_sort(by_size.begin(), by_size.end(), [&](int64_t a, int64_t b) {
      return std::get<2>(parts[a]) - std::get<1>(parts[a]) > std::get<2>(parts[b]) - std::get<1>(parts[b]);
    });
    std::atomic<int64_t> next_part{0};
    const int64_t part_threads = std::min<int64_t>(num_parts, at::get_num_threads());
    at::parallel_for(0, part_threads, 1, [&](int64_t, int64_t) {
      std::vector<float> scores;
      std::vector<vec16> work;
      for (int64_t n = next_part++; n < num_parts; n = next_part++) {
        const int64_t i = by_size[n];
        const auto [seq, first, end] = parts[i];
        const SeqLayout layout{bt_ptr + seq * max_blocks, first, end, block_size, block_stride, num_kv_heads * head_dim};
        const scalar_t* q = q_ptr + row_ptr[seq] * q_stride;
        float* o = part_out.data() + i * head_elems;
        float* lse = part_lse.data() + i * num_heads;
        attend(q, layout, Prefix{}, scores, work, o, lse);
      }
    });
    for (int64_t i = 0; i < num_parts;) {  // a sequence's parts are adjacent
      int64_t end = i + 1;
      const int64_t seq = std::get<0>(parts[i]);
      while (end < num_parts && std::get<0>(parts[end]) == seq) ++end;
      merge_parts(part_out.data() + i * head_elems, part_lse.data() + i * num_heads, end - i, num_heads, head_dim,
                  o_ptr + row_ptr[seq] * num_heads * head_dim);
      i = end;
    }
    return;
  }
  // Sequences longest first through an atomic counter: contexts differ by 10x
  // within a step, and static halves left one core idle (64 sequences of 16-384
  // tokens sorted by length: 528 us in halves, 369 us shuffled).
  std::vector<int64_t> order(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return len_ptr[a] > len_ptr[b]; });
  // First token attended: past a sliding window's start and a cascade's prefix.
  auto attended_from = [&](int64_t len) { return ::attended_from(len, sliding_window, prefix_len); };
  const int64_t row_bytes = num_kv_heads * head_dim * static_cast<int64_t>(sizeof(cache_t));
  const int64_t block_bytes = block_size * row_bytes;
  // Walks over a sequence's token rows, K's and V's (the read-ahead is spread over them).
  const int64_t passes = std::is_same_v<scalar_t, float> ? 2 : head_tile_passes<scalar_t, kChunks>(num_kv_heads, group);
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
      attend(q_ptr + q_offset, layout, prefix, scores, work, o_ptr + row_offset, nullptr);
      n = read_ahead ? ahead : next++;
    }
  });
}

template <typename scalar_t, typename cache_t = scalar_t>
void dispatch_head_dim(const torch::Tensor& query, const torch::Tensor& key_cache,
                       const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                       torch::Tensor& out, double scale, int64_t sliding_window, int64_t prefix_len,
                       const float* prefix_out, const float* prefix_lse) {
  switch (query.size(2) / kLanes) {
#define PAGODA_CHUNKS(n)                                                                      \
  case n:                                                                                     \
    return decode_kernel<scalar_t, cache_t, n>(query, key_cache, value_cache, block_tables, seq_lens, \
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
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "out must be in the query's dtype");
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type(), "key and value caches differ in dtype");
  const auto cache_type = key_cache.scalar_type();
  TORCH_CHECK(cache_serves(query.scalar_type(), cache_type),
              "paged_attention_decode: the caches must be in the query's dtype (or bf16/half under a float32 "
              "query), got ", cache_type, " for ", query.scalar_type());
  switch (query.scalar_type()) {
    case torch::kFloat:
      return with_f32_cache_type(cache_type, [&](auto element) {
        dispatch_head_dim<float, decltype(element)>(query, key_cache, value_cache, block_tables, seq_lens,
                                                    query_rows, out, scale, sliding_window, prefix_len, p_out,
                                                    p_lse);
      });
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

