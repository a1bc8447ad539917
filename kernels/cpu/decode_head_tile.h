// Decode attention for bf16/half caches, one KV head at a time (included by
// paged_attention_decode.cpp, which keeps the float32 path).
//
// A tile of kG query heads of one GQA group runs over the sequence's tokens with
// its query and output accumulators in registers: kG x kChunks vectors (at most
// 16). Walking every KV head per token instead kept all heads' accumulators in
// memory, a load and a store per FMA: on a Zen 5, 32 sequences of 32-160 tokens,
// 9/3 heads of 64, KV in cache, 73 us per layer. Each KV head reads its own 128
// bytes of every token row, so K and V still stream once per step in all; with
// bf16 pairs the keys of all heads are scored first in walks of whole row
// slices (pair_dot_key_rows), which read DRAM faster than three strided walks.
//
// q . k in float32, scores summed 16 tokens at a time by sum16 — or, over bf16 K
// with AVX512-BF16, in bf16 pairs two tokens to a vector, 32 at a time by two
// sum16_pairs (pair_dot_key_rows); out = sum_t p_t v_t in token order — over bf16 V
// with AVX512-BF16, two tokens at a time with p rounded to bf16 (pair_dot_values).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec16.h"

namespace {

#ifdef __AVX512BF16__
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

// Blocks are scattered, and the hardware prefetcher stops at page boundaries:
// while reading row i of one block, ask for row i of the block kAhead blocks on.
// KV cold in DRAM, as in a real step (30 layers of 32 x 96 tokens, blocks of 8,
// on a Zen 5): a head's 128 bytes per row 4 blocks ahead, 110 us per layer (2
// ahead: 130; whole rows 2 ahead for the first head, the rest from L2: 167).
// Whole rows (the float32 path): 2 ahead, 124-150 us on a Xeon (1: 139-162,
// 4: 161-172).
constexpr int64_t kHeadPrefetchBlocks = 4, kRowPrefetchBlocks = 2;

template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t row_elems) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = row_elems * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
}

// A cascade's prefix half for one sequence (out == nullptr: none): its rows in
// attention_over_prefix's [kv head][seq * group + g] layout.
struct Prefix {
  const float* out = nullptr;
  const float* lse = nullptr;
  int64_t seq = 0, rows = 0;  // this sequence, and rows per kv head (num_seqs * group)
  int64_t row(int head, int group) const { return (head / group) * rows + seq * group + head % group; }
};

// The next sequence's K and V blocks (contiguous, block_bytes each), prefetched
// into L2 a few lines per token row the current sequence reads, so they arrive
// while it computes. Its own prefetches 4 blocks ahead still left each sequence
// waiting on DRAM, and prefetching a whole sequence at once did nothing (most
// were dropped): on a Zen 4, 30 layers of 32 x 32-160 tokens with KV in DRAM,
// 130 -> 102 us per layer, where merely loading the KV takes 97.
struct Readahead {
  const char* k_base = nullptr;
  const char* v_base = nullptr;
  const int32_t* table = nullptr;  // the next sequence's blocks, from its first attended one
  int64_t block_bytes = 0;
  int64_t bytes = 0;  // of K (and of V) still to fetch
  int64_t rate = 0;  // lines per row read, in 1/65536ths
  // The next line to issue, of K and of V alike: `off` bytes into table[block].
  int64_t credit = 0, block = 0, off = 0;

  void step(int64_t rows) {
    for (credit += rate * rows; credit >= 65536 && bytes > 0; credit -= 65536, bytes -= 64) {
      const int64_t at = static_cast<int64_t>(table[block]) * block_bytes + off;
      __builtin_prefetch(k_base + at, 0, 1);
      __builtin_prefetch(v_base + at, 0, 1);
      if ((off += 64) >= block_bytes) {  // a block need not be whole lines
        off -= block_bytes;
        ++block;
      }
    }
  }
};

// Where one sequence's tokens lie in the paged cache.
struct SeqLayout {
  const int32_t* table;
  int64_t first, len;  // tokens [first, len) are attended
  int64_t block_size, block_stride, token_stride;
  Readahead* next = nullptr;  // the sequence this thread does next, if any
};

// How a query head's part of the output and a cascade prefix's part combine:
// out = acc * self + prefix_out * prefix (prefix 0 without a cascade). lse is
// the log-sum-exp of this part's scores, for a split sequence's merge.
struct PartWeights {
  float self, prefix, lse;
};

// One query head's scores [span], in place: exp(s - max). The softmax is
// normalised at the end, where a cascade's prefix half joins by log-sum-exp.
inline PartWeights softmax_in_place(float* sc, int64_t span, const Prefix& prefix, int head, int group) {
  const float m = max_of(sc, span);
  vnative totals = {};
  int64_t j = 0;
  for (; j + kNativeLanes <= span; j += kNativeLanes) {
    const vnative e = exp_native(load_native(sc + j) - m);
    store_native(sc + j, e);
    totals += e;
  }
  float total = sum_native(totals);
  for (; j < span; ++j) {
    sc[j] = std::exp(sc[j] - m);
    total += sc[j];
  }
  if (prefix.out == nullptr) return {1.f / total, 0.f, m + std::log(total)};
  // Both halves as exp(lse - top): this one's sums carry exp(m).
  const float lse_p = prefix.lse[prefix.row(head, group)];
  const float top = std::max(m, lse_p);
  const float w_s = std::exp(m - top), w_p = std::exp(lse_p - top);
  const float inv = 1.f / (total * w_s + w_p);
  return {w_s * inv, w_p * inv, 0.f};
}

// A query head's output row (kChunks x 16 of o_row's head) from its accumulators;
// out_t is float for one part of a split sequence (paged_attention_decode.cpp).
template <typename out_t, int kChunks>
inline void store_head(const vec16* acc, PartWeights w, const Prefix& prefix, int head, int group,
                       out_t* o_row) {
  constexpr int kDim = kChunks * kLanes;
  const float* p = prefix.out != nullptr ? prefix.out + prefix.row(head, group) * kDim : nullptr;
  for (int c = 0; c < kChunks; ++c)
    for (int l = 0; l < kLanes; ++l) {
      float o = acc[c][l] * w.self;
      if (p != nullptr) o += p[c * kLanes + l] * w.prefix;
      o_row[head * kDim + c * kLanes + l] = static_cast<out_t>(o);
    }
}

// For each token t in [first, len), in order: fn(row of t in `base`, t). Rows
// of the block kAhead blocks on are prefetched (elements [col, col + width)),
// and so are the first blocks' rows, which nothing reads ahead of.
template <int64_t kAhead, typename scalar_t, typename Fn>
inline void for_each_token(const scalar_t* base, const SeqLayout& s, int64_t col, int64_t width, Fn&& fn) {
  const int64_t first_block = s.first / s.block_size;
  for (int64_t b = first_block; b < first_block + kAhead && b * s.block_size < s.len; ++b)
    for (int64_t r = 0; r < s.block_size; ++r)
      prefetch_row(base + s.table[b] * s.block_stride + r * s.token_stride + col, width);
  for (int64_t t = s.first; t < s.len;) {
    const int64_t block = t / s.block_size, block_end = std::min(s.len, (block + 1) * s.block_size);
    const int64_t in_block = (t % s.block_size) * s.token_stride + col;
    const scalar_t* row = base + s.table[block] * s.block_stride + in_block;
    const int64_t ahead = block + kAhead;
    const scalar_t* next = ahead * s.block_size < s.len ? base + s.table[ahead] * s.block_stride + in_block : nullptr;
    if (s.next != nullptr) s.next->step(block_end - t);
    for (; t < block_end; ++t, row += s.token_stride) {
      if (next != nullptr) {
        prefetch_row(next, width);
        next += s.token_stride;
      }
      fn(row, t);
    }
  }
}

#ifdef __AVX512BF16__
// One head's probabilities [span] (float, in place) -> bf16 in the same bytes'
// first half, in token order (ties to even, as torch rounds), with a zero after
// the last: token pairs (t, t + 1) from the first attended token are then the
// 32-bit words of that half. Each group of 16 is read before its halves go over
// the first 8 of those floats.
inline void probs_to_bf16_pairs(float* p, int64_t span) {
  auto* out = reinterpret_cast<uint16_t*>(p);
  int64_t j = 0;
  for (; j + kLanes <= span; j += kLanes) store_halves(out + j, bf16_halves(load(p + j)));
  // The last 0-15 and the zero partner (2 span + 2 bytes in all, within 4 span).
  alignas(64) float tail[kLanes] = {};
  std::memcpy(tail, p + j, (span - j) * sizeof(float));
  const hvec16 halves = bf16_halves(load(tail));
  std::memcpy(out + j, &halves, (span - j + 1) * sizeof(uint16_t));
}

// Pass 2 of attend_head_tile with bf16 V on AVX512-BF16: acc[i] = sum_t p[i, t] v_t
// two tokens per vdpbf16ps, rows t and t + 1 interleaved (vpunpck{l,h}wd, within
// each 128-bit lane) against (p_t, p_t+1) rounded to bf16 — as the prefill's
// flash tiles and transformers' bf16 attention round the probabilities. Where
// each token took 4 widenings and 4 FMAs per head, a pair takes 4 interleaves
// and 4 vdpbf16ps per head. The accumulators' lanes come out in interleave order
// and are put back in dimension order at the end.
template <int kChunks, int kG, typename scalar_t>
inline void pair_dot_values(const scalar_t* v_base, const SeqLayout& s, int64_t col, int64_t span, float* scores,
                            vec16 (&acc)[kG][kChunks]) {
  constexpr int kDim = kChunks * kLanes;
  for (int i = 0; i < kG; ++i) probs_to_bf16_pairs(scores + i * span, span);
  __m512 pacc[kG][kChunks];
  for (int i = 0; i < kG; ++i)
    for (int c = 0; c < kChunks; ++c) pacc[i][c] = _mm512_setzero_ps();
  // Tokens j, j + 1 of the span (b: null past the last).
  auto pair = [&](const scalar_t* a, const scalar_t* b, int64_t j) {
    __m512bh vp[kChunks];
    for (int h = 0; h < kChunks / 2; ++h) {
      const __m512i ra = _mm512_loadu_si512(a + h * 32);
      const __m512i rb = b != nullptr ? _mm512_loadu_si512(b + h * 32) : _mm512_setzero_si512();
      vp[2 * h] = (__m512bh)_mm512_unpacklo_epi16(ra, rb);
      vp[2 * h + 1] = (__m512bh)_mm512_unpackhi_epi16(ra, rb);
    }
    for (int i = 0; i < kG; ++i) {
      uint32_t probs;
      std::memcpy(&probs, reinterpret_cast<const uint16_t*>(scores + i * span) + j, 4);
      const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int>(probs));
      for (int c = 0; c < kChunks; ++c) pacc[i][c] = _mm512_dpbf16_ps(pacc[i][c], pp, vp[c]);
    }
  };
  const scalar_t* held = nullptr;
  for_each_token<kHeadPrefetchBlocks>(v_base, s, col, kDim, [&](const scalar_t* v, int64_t t) {
    if (held == nullptr) {
      held = v;
      return;
    }
    pair(held, v, t - 1 - s.first);
    held = nullptr;
  });
  if (held != nullptr) pair(held, nullptr, span - 1);
  // Lane 4 L + w of the low (high) interleave holds dimension 8 L + w (8 L + 4 + w)
  // of its 32; dimension d of the first 16 is lane (d / 8) * 4 + d % 8 % 4 of the
  // low (d % 8 < 4) or high one, the last 16 the same from L = 2.
  alignas(64) int32_t first[16], second[16];
  for (int d = 0; d < 16; ++d) {
    const int from = (d % 8 < 4 ? 0 : 16) + d / 8 * 4 + d % 4;
    first[d] = from, second[d] = from + 8;
  }
  const __m512i idx_first = _mm512_load_si512(first), idx_second = _mm512_load_si512(second);
  for (int i = 0; i < kG; ++i)
    for (int h = 0; h < kChunks / 2; ++h) {
      acc[i][2 * h] = reinterpret_cast<vec16>(_mm512_permutex2var_ps(pacc[i][2 * h], idx_first, pacc[i][2 * h + 1]));
      acc[i][2 * h + 1] =
          reinterpret_cast<vec16>(_mm512_permutex2var_ps(pacc[i][2 * h], idx_second, pacc[i][2 * h + 1]));
    }
}

// Pass 1 of attend_head_tile with bf16 K on AVX512-BF16, for the query heads of
// KV heads [h0, h1) at once: scores[i, t] = scale * q_i . k_t, two tokens per
// vector. Each 16-dimension chunk of rows t and t + 1 goes side by side into one
// register (a 256-bit load and an insert) against that chunk of q_i in both
// halves, so one vdpbf16ps chain per head leaves t's partial sums in lanes 0-7
// and t + 1's in 8-15: the first level of the 16-token transposing reduction is
// done by the products, and 32 tokens take two sum16_pairs (7 shuffle-adds each)
// where one token a vector took two sum16 (15 each).
// The keys are walked once for all those heads, each token row's slice read
// whole and in address order: a walk per KV head read 128 of every 384 bytes
// (SmolLM2's 3 KV heads of 64) three times over. The same walk asks for the V
// rows' slices (into L2) that the tiles' pass 2 reads later, head by head. On a
// Zen 4, 30 layers with K/V in DRAM (bench/decode_attention_ab.py, 16 / 32 / 64
// sequences of the `mixed` step): the keys this way 0.83 / 0.91 / 0.86x the time
// of a walk per KV head, and asking for V here 0.94 / 0.94 / 0.96x that again;
// without the tiles' own V prefetches after it, 1.12-1.21x (V is not all in L2
// by then). The values walked the same way, their 9 x 4 accumulators in memory
// (more than the registers), ran 1.27x the tiles' time with the KV in cache and
// 0.98-1.02x from DRAM, so pass 2 stays per tile. qq and dots ([heads][kChunks]
// queries, [heads][16] pending token pairs) live in `work`, sized by
// key_rows_heads to stay in L1.
template <int kChunks, typename scalar_t>
inline void pair_dot_key_rows(const scalar_t* q_row, const scalar_t* k_base, const scalar_t* v_base,
                              const SeqLayout& s, int h0, int h1, int group, int64_t span, float scale,
                              float* scores, std::vector<vec16>& work) {
  constexpr int kDim = kChunks * kLanes;
  const int heads = (h1 - h0) * group, first_head = h0 * group;
  work.resize(static_cast<size_t>(heads) * (kChunks + kLanes));
  __m512bh* qq = reinterpret_cast<__m512bh*>(work.data());
  vec16* dots = work.data() + static_cast<size_t>(heads) * kChunks;
  for (int i = 0; i < heads; ++i)
    for (int c = 0; c < kChunks; ++c)
      qq[i * kChunks + c] = (__m512bh)_mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q_row + (first_head + i) * kDim + c * kLanes)));
  int64_t pending = 0, done = 0;  // pairs in dots; tokens already scored
  auto flush = [&] {
    // Whole only when every one of the 32 is a token (an odd span's last pair has
    // the zero row, past the head's scores).
    const bool whole = pending == kLanes && done + 2 * kLanes <= span;
    for (int i = 0; i < heads; ++i) {
      const vec16* d = dots + i * kLanes;
      float* out = scores + (first_head + i) * span + done;
      if (whole) {
        for (int h = 0; h < 2; ++h) {
          const vec16 r = sum16_pairs(d + 8 * h) * scale;
          std::memcpy(out + 16 * h, &r, sizeof(r));
        }
        continue;
      }
      for (int64_t j = 0; j < 2 * pending && done + j < span; ++j) {
        float total = 0.f;
        for (int l = 0; l < 8; ++l) total += d[j / 2][j % 2 * 8 + l];
        out[j] = total * scale;
      }
    }
    done += 2 * pending;
    pending = 0;
  };
  // a, b: rows t and t + 1 from KV head h0's slice on; b nullptr: an odd span's
  // last token, against a zero row. Exact products, float32 sums, the scale after.
  auto pair = [&](const scalar_t* a, auto b) {
    for (int h = 0; h < h1 - h0; ++h) {
      __m512bh y[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + h * kDim + c * kLanes));
        __m256i hi = _mm256_setzero_si256();
        if constexpr (!std::is_same_v<decltype(b), std::nullptr_t>)
          hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + h * kDim + c * kLanes));
        y[c] = (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      }
      for (int g = 0; g < group; ++g) {
        const int i = h * group + g;
        __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), qq[i * kChunks], y[0]);
        for (int c = 1; c < kChunks; ++c) d = _mm512_dpbf16_ps(d, qq[i * kChunks + c], y[c]);
        dots[i * kLanes + pending] = reinterpret_cast<vec16>(d);
      }
    }
    if (++pending == kLanes) flush();
  };
  const int64_t width = (h1 - h0) * kDim;
  const scalar_t* held = nullptr;
  for_each_token<kHeadPrefetchBlocks>(k_base, s, h0 * kDim, width, [&](const scalar_t* k, int64_t) {
    prefetch_row(v_base + (k - k_base), width);  // V's row: the same offset in its cache
    if (held == nullptr) {
      held = k;
      return;
    }
    pair(held, k);
    held = nullptr;
  });
  if (held != nullptr) pair(held, nullptr);
  if (pending > 0) flush();
}
#endif

// Whether a head's dots go in bf16 pairs (pair_dot_key_rows / pair_dot_values).
template <typename scalar_t, int kChunks>
constexpr bool kPairDots = kBf16Dot && std::is_same_v<scalar_t, at::BFloat16> && kChunks % 2 == 0;

// Query heads head0 .. head0 + kG - 1 (all of KV head h) of one sequence.
// q_row/o_row: the sequence's [num_heads, head_dim] rows; scores: kG x span floats.
// For one part of a split sequence o_row is float and lse_row ([num_heads]) gets
// each head's log-sum-exp; otherwise lse_row is null.
template <typename scalar_t, int kChunks, int kG, typename out_t>
void attend_head_tile(const scalar_t* q_row, const scalar_t* k_base, const scalar_t* v_base, const SeqLayout& s,
                      int h, int head0, int group, float scale, const Prefix& prefix, float* scores,
                      out_t* o_row, float* lse_row) {
  constexpr int kDim = kChunks * kLanes;
  constexpr bool kPairs = kPairDots<scalar_t, kChunks>;
  const int64_t span = s.len - s.first, col = h * kDim;

  // Pass 1: scores[i, t] = q_i . k_t (scaled); with bf16 pairs pair_dot_key_rows
  // scored every head's keys before the tiles.
  if constexpr (!kPairs) {
    // Dot vectors of 16 tokens collect in `dots`; one transposing reduction
    // (sum16) turns them into 16 scores.
    vec16 q[kG][kChunks];
    for (int i = 0; i < kG; ++i)
      for (int c = 0; c < kChunks; ++c) q[i][c] = load(q_row + (head0 + i) * kDim + c * kLanes) * scale;
    vec16 dots[kG][kLanes];
    int64_t pending = 0;
    auto flush = [&](int64_t t_end) {
      const int64_t offset = t_end - pending - s.first;
      for (int i = 0; i < kG; ++i) {
        float* out = scores + i * span + offset;
        if (pending == kLanes) {
          sum16_store(dots[i], out);
        } else {
          for (int64_t j = 0; j < pending; ++j) out[j] = sum(dots[i][j]);
        }
      }
      pending = 0;
    };
    for_each_token<kHeadPrefetchBlocks>(k_base, s, col, kDim, [&](const scalar_t* k, int64_t t) {
      vec16 kv[kChunks];
      for (int c = 0; c < kChunks; ++c) kv[c] = load(k + c * kLanes);
      for (int i = 0; i < kG; ++i) {
        vec16 dot = q[i][0] * kv[0];
        for (int c = 1; c < kChunks; ++c) dot += q[i][c] * kv[c];
        dots[i][pending] = dot;
      }
      if (++pending == kLanes) flush(t + 1);
    });
    if (pending > 0) flush(s.len);
  }

  PartWeights weights[kG];
  for (int i = 0; i < kG; ++i) weights[i] = softmax_in_place(scores + i * span, span, prefix, head0 + i, group);

  // Pass 2: out_i = sum_t p[i, t] v_t, accumulated in registers.
  vec16 acc[kG][kChunks] = {};
  if constexpr (kPairs) {
#ifdef __AVX512BF16__
    pair_dot_values<kChunks, kG>(v_base, s, col, span, scores, acc);
#endif
  } else {
    for_each_token<kHeadPrefetchBlocks>(v_base, s, col, kDim, [&](const scalar_t* v, int64_t t) {
      vec16 vv[kChunks];
      for (int c = 0; c < kChunks; ++c) vv[c] = load(v + c * kLanes);
      for (int i = 0; i < kG; ++i) {
        const float p = scores[i * span + (t - s.first)];
        for (int c = 0; c < kChunks; ++c) acc[i][c] += p * vv[c];
      }
    });
  }
  for (int i = 0; i < kG; ++i) {
    store_head<out_t, kChunks>(acc[i], weights[i], prefix, head0 + i, group, o_row);
    if (lse_row != nullptr) lse_row[head0 + i] = weights[i].lse;
  }
}

// Query heads per tile: their accumulators and queries fit the 32 registers.
template <int kChunks>
constexpr int kMaxTile = std::max(1, std::min(4, 16 / kChunks));

// KV heads one pair_dot_key_rows walk covers: their queries and pending dots
// within 16 KB, half an L1 (SmolLM2's 3 KV heads of 3 x 64: all, 11.5 KB).
template <int kChunks>
constexpr int key_rows_heads(int num_kv_heads, int group) {
  const int per_kv_head = group * (kChunks + kLanes) * static_cast<int>(sizeof(vec16));
  return std::max(1, std::min(num_kv_heads, 16 * 1024 / per_kv_head));
}

// Walks over a sequence's token rows decode_sequence_by_head makes, K and V
// together: the readahead of the next sequence is spread over them.
template <typename scalar_t, int kChunks>
constexpr int64_t head_tile_passes(int num_kv_heads, int group) {
  const int tiles = num_kv_heads * ((group + kMaxTile<kChunks> - 1) / kMaxTile<kChunks>);
  if constexpr (kPairDots<scalar_t, kChunks>) {
    const int per_walk = key_rows_heads<kChunks>(num_kv_heads, group);
    return tiles + (num_kv_heads + per_walk - 1) / per_walk;
  }
  return 2 * tiles;
}

// Every query head of one sequence, KV head by KV head, tiles of up to kMaxTile;
// with bf16 pairs, the keys of all heads first in whole-row walks.
template <typename scalar_t, int kChunks, typename out_t>
void decode_sequence_by_head(const scalar_t* q_row, const scalar_t* k_base, const scalar_t* v_base,
                             const SeqLayout& s, int num_kv_heads, int group, float scale, const Prefix& prefix,
                             std::vector<float>& scores, std::vector<vec16>& work, out_t* o_row, float* lse_row) {
  constexpr int kTile = kMaxTile<kChunks>;
  const int64_t span = s.len - s.first;
  constexpr bool kPairs = kPairDots<scalar_t, kChunks>;
  if constexpr (kPairs) {
#ifdef __AVX512BF16__
    scores.resize(static_cast<size_t>(num_kv_heads) * group * span);
    const int per_walk = key_rows_heads<kChunks>(num_kv_heads, group);
    for (int h0 = 0; h0 < num_kv_heads; h0 += per_walk)
      pair_dot_key_rows<kChunks>(q_row, k_base, v_base, s, h0, std::min(num_kv_heads, h0 + per_walk), group,
                                 span, scale, scores.data(), work);
#endif
  } else {
    scores.resize(static_cast<size_t>(kTile) * span);
  }
  for (int h = 0; h < num_kv_heads; ++h)
    for (int g = 0; g < group;) {
      const int n = std::min(kTile, group - g), head0 = h * group + g;
      float* tile_scores = scores.data() + (kPairs ? head0 * span : 0);
      switch (n) {
#define PAGODA_TILE(r)                                                                                        \
  case r:                                                                                                     \
    if constexpr (r <= kTile)                                                                                 \
      attend_head_tile<scalar_t, kChunks, r>(q_row, k_base, v_base, s, h, head0, group, scale, prefix,        \
                                             tile_scores, o_row, lse_row);                                    \
    break;
        PAGODA_TILE(1) PAGODA_TILE(2) PAGODA_TILE(3) PAGODA_TILE(4)
#undef PAGODA_TILE
      }
      g += n;
    }
}

}  // namespace
