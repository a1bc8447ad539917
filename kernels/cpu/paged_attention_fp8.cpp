// Paged attention over an FP8 (e4m3, per-tensor scale) KV cache on CPU:
// --kv-cache-dtype fp8. Its own extension (kernels/cpu/__init__.py:
// load_fp8_kv_kernels), built apart from the bf16/float32 attention kernels, so
// neither rebuilds the other.
//
// write_kv_cache_fp8 quantizes a step's new K/V rows into their slots:
// code = e4m3(clamp(x * (1 / scale), +-448)), ties to even (fp8_e4m3.h).
//
// paged_attention_fp8 serves decode and prefill rows alike, in one call per
// layer: a task is (sequence, KV head, a tile of up to kTileQueries query
// vectors: the GQA group's heads at consecutive positions). It walks the
// context 16 tokens at a time flash-style (online softmax, float32
// accumulators): each K and V row is read once per tile as bytes, half the
// bf16 traffic, and widened to float32 in registers; q . k is 16 dot vectors
// summed by one transposing tree (sum16). k_scale folds into the softmax scale
// and v_scale into the final normalisation, so no dequantized copy exists.
// Decode rows (tiles of one position) are memory-bound and this is where the
// halved bytes pay; prefill rows run float32 FMAs, slower than the bf16 tiles
// of paged_attention_prefill.cpp (the price of reading e4m3 in place).
//
// Shapes:
//   key, value:          [num_tokens, num_kv_heads, head_dim] float32/bf16/half
//                        (rows may be strided, heads contiguous)
//   key/value_cache:     [num_blocks, block_size, num_kv_heads, head_dim] float8_e4m3fn
//   slot_mapping:        [num_tokens] int64
//   query, out:          [num_tokens, num_heads, head_dim]; query rows may be strided
//   block_tables:        [num_seqs, max_num_blocks] int32
//   seq_lens:            [num_seqs] int32, context length including the new rows
//   query_start_loc:     [num_seqs + 1] int64: sequence i's rows are
//                        [qsl[i], qsl[i + 1]), its last positions
// The plain-PyTorch twins are write_kv_reference and paged_attention_reference
// in kernels/paged_attention_reference.py (fp8 caches, k_scale / v_scale).
#include <torch/python.h>
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "fp8_e4m3.h"
#include "vec16.h"

namespace {

constexpr int kTokens = 16;        // context tokens per softmax step (one sum16)
constexpr int kTileQueries = 16;   // query vectors sharing one pass over K/V

template <typename scalar_t>
void quantize_rows(const scalar_t* rows, int64_t row_stride, const int64_t* slots, int64_t num_tokens,
                   int64_t row_elems, float inv_scale, uint8_t* cache) {
  at::parallel_for(0, num_tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const scalar_t* x = rows + t * row_stride;
      uint8_t* o = cache + slots[t] * row_elems;
      for (int64_t i = 0; i < row_elems; i += kLanes) store_e4m3(o + i, load(x + i) * inv_scale);
    }
  });
}

// One task's query vectors: vector j is head (h * group + j % group) at the
// tile's position first_pos + j / group.
struct Tile {
  int64_t seq, h, first_row, rows;
};

template <typename scalar_t, int kChunks>
void attend_tile(const Tile& tile, const scalar_t* q_ptr, int64_t q_stride, const uint8_t* kc,
                 const uint8_t* vc, const int32_t* table, int64_t seq_len, int64_t first_pos,
                 int64_t block_size, int num_kv_heads, int group, float q_scale, float v_scale,
                 int64_t window, scalar_t* o_ptr, int64_t num_heads) {
  constexpr int kDim = kChunks * kLanes;
  const int nq = static_cast<int>(tile.rows) * group;
  vec16 q[kTileQueries][kChunks], acc[kTileQueries][kChunks];
  float m[kTileQueries], l[kTileQueries];
  int64_t pos[kTileQueries];
  for (int j = 0; j < nq; ++j) {
    const int64_t row = tile.first_row + j / group, head = tile.h * group + j % group;
    pos[j] = first_pos + j / group;
    for (int c = 0; c < kChunks; ++c) {
      q[j][c] = load(q_ptr + row * q_stride + head * kDim + c * kLanes) * q_scale;
      acc[j][c] = vec16{};
    }
    m[j] = -INFINITY;
    l[j] = 0.f;
  }
  const int64_t last = pos[nq - 1];
  const int64_t lo = window > 0 ? std::max<int64_t>(0, pos[0] - window + 1) : 0;
  const int64_t row_elems = static_cast<int64_t>(num_kv_heads) * kDim;
  auto row_of = [&](const uint8_t* base, int64_t t) {
    return base + (static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size) * row_elems +
           tile.h * kDim;
  };
  // A chunk's K and V rows, widened once into L1 and read by every query
  // vector, whose query and accumulators then stay in registers (walking
  // vectors per token instead kept 6 x 8 accumulators in memory: a load and a
  // store per FMA, 3.8x the bf16 kernel's time at 32 x 512 tokens).
  vec16 kw[kTokens][kChunks], vw[kTokens][kChunks];
  for (int64_t t0 = lo; t0 <= last; t0 += kTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kTokens, last + 1 - t0));
    for (int i = 0; i < kTokens; ++i) {
      if (i < n) {
        const uint8_t* kr = row_of(kc, t0 + i);
        const uint8_t* vr = row_of(vc, t0 + i);
        for (int c = 0; c < kChunks; ++c) {
          kw[i][c] = widen_e4m3(kr + c * kLanes);
          vw[i][c] = widen_e4m3(vr + c * kLanes);
        }
      } else {
        for (int c = 0; c < kChunks; ++c) kw[i][c] = vw[i][c] = vec16{};
      }
    }
    // Every token of the chunk visible to every vector: no mask (all but a
    // causal or window edge).
    const bool whole = t0 + n - 1 <= pos[0] && (window <= 0 || last - t0 < window) && n == kTokens;
    for (int j = 0; j < nq; ++j) {
      vec16 qr[kChunks];
      for (int c = 0; c < kChunks; ++c) qr[c] = q[j][c];
      vec16 dots[kTokens];
      for (int i = 0; i < kTokens; ++i) {
        vec16 d = qr[0] * kw[i][0];
        for (int c = 1; c < kChunks; ++c) d += qr[c] * kw[i][c];
        dots[i] = d;
      }
      vec16 s = sum16(dots);
      if (!whole) {
        for (int i = 0; i < kTokens; ++i) {
          const int64_t t = t0 + i;
          const bool seen = i < n && t <= pos[j] && (window <= 0 || pos[j] - t < window);
          s[i] = seen ? s[i] : -INFINITY;
        }
      }
      float top = m[j];
      for (int i = 0; i < kTokens; ++i) top = std::max(top, s[i]);
      if (top == -INFINITY) continue;  // nothing of this chunk is visible to this row yet
      vec16 e = exp16(s - top);
      if (!whole) e = s == -INFINITY ? vec16{} : e;  // exp16 clamps: -inf gives ~1e-38
      const float correction = std::exp(m[j] - top);
      l[j] = l[j] * correction + sum(e);
      m[j] = top;
      vec16 a[kChunks];
      for (int c = 0; c < kChunks; ++c) a[c] = acc[j][c] * correction;
      for (int i = 0; i < n; ++i) {
        const float w = e[i];
        for (int c = 0; c < kChunks; ++c) a[c] += w * vw[i][c];
      }
      for (int c = 0; c < kChunks; ++c) acc[j][c] = a[c];
    }
  }
  for (int j = 0; j < nq; ++j) {
    const int64_t row = tile.first_row + j / group, head = tile.h * group + j % group;
    const float norm = v_scale / l[j];  // l >= 1: the row always sees its own token
    scalar_t* o = o_ptr + (row * num_heads + head) * kDim;
    for (int c = 0; c < kChunks; ++c)
      for (int i = 0; i < kLanes; ++i) o[c * kLanes + i] = static_cast<scalar_t>(acc[j][c][i] * norm);
  }
}

template <typename scalar_t, int kChunks>
void attention_kernel(const torch::Tensor& query, const torch::Tensor& key_cache,
                      const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                      const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
                      torch::Tensor& out, double scale, double k_scale, double v_scale,
                      int64_t sliding_window) {
  const int64_t num_seqs = seq_lens.size(0), num_heads = query.size(1);
  const int num_kv_heads = static_cast<int>(key_cache.size(2));
  const int group = static_cast<int>(num_heads / num_kv_heads);
  const int64_t rows_per_tile = std::max(1, kTileQueries / group);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t* qsl = query_start_loc.data_ptr<int64_t>();
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t r = qsl[s]; r < qsl[s + 1]; r += rows_per_tile)
      for (int64_t h = 0; h < num_kv_heads; ++h)
        tiles.push_back({s, h, r, std::min(rows_per_tile, qsl[s + 1] - r)});
  // Longest contexts first: a prefill's late tiles and long decodes dominate.
  std::stable_sort(tiles.begin(), tiles.end(), [&](const Tile& a, const Tile& b) {
    return (lens[a.seq] - qsl[a.seq + 1] + a.first_row) > (lens[b.seq] - qsl[b.seq + 1] + b.first_row);
  });
  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  const uint8_t* kc = static_cast<const uint8_t*>(key_cache.data_ptr());
  const uint8_t* vc = static_cast<const uint8_t*>(value_cache.data_ptr());
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int64_t max_blocks = block_tables.size(1), block_size = key_cache.size(1);
  scalar_t* o_ptr = out.data_ptr<scalar_t>();
  const float q_scale = static_cast<float>(scale * k_scale), vs = static_cast<float>(v_scale);
  at::parallel_for(0, static_cast<int64_t>(tiles.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Tile& t = tiles[i];
      const int64_t first_pos = lens[t.seq] - (qsl[t.seq + 1] - t.first_row);
      attend_tile<scalar_t, kChunks>(t, q_ptr, query.stride(0), kc, vc, bt + t.seq * max_blocks, lens[t.seq],
                                     first_pos, block_size, num_kv_heads, group, q_scale, vs, sliding_window,
                                     o_ptr, num_heads);
    }
  });
}

template <typename scalar_t>
void dispatch_head_dim(const torch::Tensor& query, const torch::Tensor& key_cache,
                       const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
                       torch::Tensor& out, double scale, double k_scale, double v_scale,
                       int64_t sliding_window) {
  switch (query.size(2) / kLanes) {
#define PAGODA_CHUNKS(n)                                                                             \
  case n:                                                                                            \
    return attention_kernel<scalar_t, n>(query, key_cache, value_cache, block_tables, seq_lens,     \
                                         query_start_loc, out, scale, k_scale, v_scale, sliding_window);
    PAGODA_CHUNKS(1) PAGODA_CHUNKS(2) PAGODA_CHUNKS(4) PAGODA_CHUNKS(8) PAGODA_CHUNKS(16)
#undef PAGODA_CHUNKS
    default:
      TORCH_CHECK(false, "paged_attention_fp8: head_dim ", query.size(2), " is not supported");
  }
}

void check_cache(const torch::Tensor& cache, const char* name) {
  TORCH_CHECK(cache.scalar_type() == at::kFloat8_e4m3fn && cache.is_contiguous() && cache.dim() == 4, name,
              " must be a contiguous float8_e4m3fn [blocks, block_size, kv_heads, head_dim] tensor");
}

bool heads_contiguous(const torch::Tensor& x) {
  return x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2);
}

}  // namespace

// Head shapes the kernels take: head_dim 16, 32, 64, 128 or 256, whole GQA groups of
// at most 16 heads.
bool supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t chunks = head_dim / kLanes;
  return num_heads % num_kv_heads == 0 && num_heads / num_kv_heads <= kTileQueries &&
         head_dim % kLanes == 0 && (chunks == 1 || chunks == 2 || chunks == 4 || chunks == 8 || chunks == 16);
}

void write_kv_cache_fp8(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& key_cache,
                        torch::Tensor& value_cache, const torch::Tensor& slot_mapping, double k_scale,
                        double v_scale) {
  check_cache(key_cache, "key_cache");
  check_cache(value_cache, "value_cache");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  TORCH_CHECK(heads_contiguous(key) && heads_contiguous(value) && key.scalar_type() == value.scalar_type(),
              "key and value must be [tokens, kv_heads, head_dim] of one dtype with contiguous heads");
  TORCH_CHECK(key.size(1) == key_cache.size(2) && key.size(2) == key_cache.size(3) &&
                  value.size(1) == value_cache.size(2) && value.size(2) == value_cache.size(3),
              "rows do not match their cache's heads");
  const int64_t row_elems = key.size(1) * key.size(2);
  TORCH_CHECK(row_elems % kLanes == 0, "kv_heads * head_dim must be a multiple of 16");
  const int64_t num_tokens = slot_mapping.size(0);
  TORCH_CHECK(key.size(0) >= num_tokens && value.size(0) >= num_tokens, "fewer rows than slots");
  TORCH_CHECK(k_scale > 0 && v_scale > 0, "k_scale and v_scale must be positive");
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t)
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " out of range");
  // The reciprocal in float32, as the twin computes it: x * (1 / scale).
  const float k_inv = 1.f / static_cast<float>(k_scale), v_inv = 1.f / static_cast<float>(v_scale);
  uint8_t* kc = static_cast<uint8_t*>(key_cache.data_ptr());
  uint8_t* vc = static_cast<uint8_t*>(value_cache.data_ptr());
  auto both = [&](auto* typed) {
    using scalar_t = std::remove_pointer_t<decltype(typed)>;
    quantize_rows(key.data_ptr<scalar_t>(), key.stride(0), slots, num_tokens, row_elems, k_inv, kc);
    quantize_rows(value.data_ptr<scalar_t>(), value.stride(0), slots, num_tokens, row_elems, v_inv, vc);
  };
  switch (key.scalar_type()) {
    case torch::kFloat:
      return both(static_cast<float*>(nullptr));
    case torch::kBFloat16:
      return both(static_cast<at::BFloat16*>(nullptr));
    case torch::kHalf:
      return both(static_cast<at::Half*>(nullptr));
    default:
      TORCH_CHECK(false, "write_kv_cache_fp8: unsupported dtype ", key.scalar_type());
  }
}

void paged_attention_fp8(const torch::Tensor& query, const torch::Tensor& key_cache,
                         const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                         const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
                         torch::Tensor& out, double scale, double k_scale, double v_scale,
                         int64_t sliding_window) {
  check_cache(key_cache, "key_cache");
  check_cache(value_cache, "value_cache");
  TORCH_CHECK(heads_contiguous(query) && out.is_contiguous() && out.sizes() == query.sizes() &&
                  out.scalar_type() == query.scalar_type(),
              "query needs contiguous heads (rows may be strided); out contiguous, of query's shape and dtype");
  TORCH_CHECK(supports(query.size(1), key_cache.size(2), query.size(2)) && query.size(2) == key_cache.size(3),
              "paged_attention_fp8: unsupported head shape");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "block_tables must be contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(), "seq_lens must be int32");
  TORCH_CHECK(query_start_loc.scalar_type() == torch::kInt64 && query_start_loc.is_contiguous() &&
                  query_start_loc.size(0) == seq_lens.size(0) + 1,
              "query_start_loc must be int64 [num_seqs + 1]");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t* qsl = query_start_loc.data_ptr<int64_t>();
  const int64_t capacity = block_tables.size(1) * key_cache.size(1);
  const int64_t num_blocks = key_cache.size(0);
  for (int64_t s = 0; s < seq_lens.size(0); ++s) {
    const int64_t rows = qsl[s + 1] - qsl[s];
    TORCH_CHECK(rows >= 1 && qsl[s + 1] <= query.size(0) && lens[s] >= rows && lens[s] <= capacity,
                "sequence ", s, ": bad query rows or length");
    const int32_t* table = block_tables.data_ptr<int32_t>() + s * block_tables.size(1);
    for (int64_t b = 0; b * key_cache.size(1) < lens[s]; ++b)
      TORCH_CHECK(table[b] >= 0 && table[b] < num_blocks, "sequence ", s, ": block ", table[b], " out of range");
  }
  switch (query.scalar_type()) {
    case torch::kFloat:
      return dispatch_head_dim<float>(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                                      out, scale, k_scale, v_scale, sliding_window);
    case torch::kBFloat16:
      return dispatch_head_dim<at::BFloat16>(query, key_cache, value_cache, block_tables, seq_lens,
                                             query_start_loc, out, scale, k_scale, v_scale, sliding_window);
    case torch::kHalf:
      return dispatch_head_dim<at::Half>(query, key_cache, value_cache, block_tables, seq_lens,
                                         query_start_loc, out, scale, k_scale, v_scale, sliding_window);
    default:
      TORCH_CHECK(false, "paged_attention_fp8: unsupported query dtype ", query.scalar_type());
  }
}

// Kernels run without the GIL (no Python object in their bodies), as in module.cpp;
// the capability query keeps it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supports", &supports, "Whether paged_attention_fp8 takes these head shapes");
  m.def("write_kv_cache_fp8", &write_kv_cache_fp8, "Quantize new K/V rows to e4m3 into their cache slots",
        py::arg("key"), py::arg("value"), py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        py::call_guard<py::gil_scoped_release>());
  m.def("paged_attention_fp8", &paged_attention_fp8,
        "Paged attention of decode and prefill rows over an e4m3 KV cache", py::arg("query"), py::arg("key_cache"),
        py::arg("value_cache"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_start_loc"),
        py::arg("out"), py::arg("scale"), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        py::arg("sliding_window") = 0,
        py::call_guard<py::gil_scoped_release>());
}
