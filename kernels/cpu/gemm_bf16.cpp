// bf16 linear layers (y = x W^T + b) on CPUs with AVX512-BF16 or AMX, from
// weights packed once at load into 32-column panels.
//
// At decode batch sizes (8-64 rows) a linear streams its whole weight from DRAM
// for a few FLOPs per byte. Here each panel ([K/2][32 columns][2]) is one
// contiguous stream, and a block of rows of x runs against it:
// * AMX (K a multiple of 32): one or two 16-row tiles of x against the panel's
//   two 16-column B tiles, four C tiles. On a 2-core Xeon with AMX (30 SmolLM2
//   layers at 32 rows, weights cold) 16 vs 39 ms for oneDNN's prepacked linear;
//   level with it from 256 to 2048 rows (610-740 vs 620-800 GFLOP/s per shape).
//   The vdpbf16ps loop (then 12 rows x one panel) ran at 135 GFLOP/s there.
// * AVX512-BF16 (panel_block_dp.h): a block of at most 6 rows (blocks evened
//   out) against two panels, 24 accumulators: per pair of k, four panel loads,
//   one broadcast bf16 pair of x per row, four vdpbf16ps per row; each block
//   prefetches a slice of a later unit's panels. Single panels in blocks of up
//   to 12 rows where pairs would leave too few units to share out. On a Zen 5
//   (30 layers, weights cold, 12 rows x one panel then): 8.3 vs 12.5 ms for
//   oneDNN at 32 rows (820 GFLOP/s; 880 with the weights in cache), 15.8 vs
//   19.9 at 64, and 945 vs 923 GFLOP/s at 512 rows.
//
// Shapes:
//   weight:  [N, K] bf16, N a multiple of 32, K even
//   packed:  [N / 32, K / 2, 64] bf16: panel p, k pair kp holds columns
//            p * 32 .. p * 32 + 31, each as (W[n][2 kp], W[n][2 kp + 1])
//   x:       [M, K] bf16, contiguous; bias: [N] bf16 or undefined; out: [M, N] bf16
//   bf16_panel_linear_silu: W = [gate; up] (N % 64 == 0), out: [M, N / 2] bf16
// The plain twins are F.linear, and F.linear then SiluAndMul
// (worker/layers/quantization/cpu_packed.py, worker/layers/activation.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <vector>

#include "amx.h"
#include "panel_block_dp.h"
#include "vec16.h"


namespace {

constexpr int kPanel = 32;  // output columns per panel: two 16-lane accumulators

#ifdef __AVX512BF16__
// The many-row path: x past 1 MB (this Zen 5's L2; up to there panel-major
// reads x from L2 and keeps the next-panel prefetch) goes out in row chunks of
// about 128 KB. One layer's linears on one Zen 5 core (thread CPU time, medians
// of 5 alternating rounds) at 4096 rows, GFLOP/s before -> 128 KB chunks
// (256 KB chunks): qkv 404 -> 492 (494), o 411 -> 478 (473), gate_up+silu
// 352 -> 436 (398), down 335 -> 494 (462); at 2048 rows 1.0-1.1x.
constexpr int64_t kChunkBytes = 128 * 1024;
// An output past L2 (SmolLM2's LM head at 36 rows: 3.5 MB) is written with
// streaming stores: otherwise every 64-byte row slice of a panel misses L2 and
// is read in before it is written, and the bursts of misses at each block's end
// stall the weight stream (one thread, 36 rows: 68% of the peak against 81-87%
// for the layers' linears).
constexpr int64_t kStreamAbove = 1024 * 1024;
constexpr int64_t kChunkAbove = 1024 * 1024;

// Rows of an AMX unit's output at once (two tiles).
constexpr int kScratchRows = 32;

// 16 lanes of out = silu(gate) * up from scratch rows of [gate 32 | up 32]:
// vector v is row v / 2, lanes v % 2 * 16 .., with silu_and_mul's arithmetic
// (silu_mul_bf16), so fused and unfused agree bit for bit.
inline void silu_and_mul_vector(const uint16_t* scratch, int v, uint16_t* out, int64_t ldo) {
  const int r = v / 2, i = v % 2 * kLanes;
  const vec16 g = load(reinterpret_cast<const at::BFloat16*>(scratch + r * 2 * kPanel + i));
  const vec16 u = load(reinterpret_cast<const at::BFloat16*>(scratch + r * 2 * kPanel + kPanel + i));
  store_bf16(out + r * ldo + i, silu_mul_bf16(g, u));
}

// A unit's silu(gate) * up, done a few 16-lane vectors at a time inside the
// tile loops of the units after it (AMX, one per thread). Right after the unit's
// products its SiLU ran alone, the tile unit idle: at 4096 rows of SmolLM2's
// gate/up that took 1.35x the time of the same products unfused (AMX Xeon,
// family 6 model 167: 8.8 vs 6.5 ms). Same arithmetic per element, so the same
// bits. Two scratch tiles: the units' products go to one while the other's
// SiLU is pending.
struct SiluPipe {
  alignas(64) uint16_t scratch[2][kScratchRows * 2 * kPanel];
  const uint16_t* src = nullptr;
  uint16_t* out = nullptr;
  int64_t ldo = 0;
  int done = 0, total = 0;  // 16-lane vectors: two per row
  int per_step = 1;         // vectors per k step of a tile loop
  int fill = 0;             // the scratch tile the next unit's products go to

  // Vectors [done, done + n) of the pending unit.
  void step(int n) {
    for (const int end = std::min(total, done + n); done < end; ++done) silu_and_mul_vector(src, done, out, ldo);
  }
  void finish() { step(total); }
  // The next unit's products go to scratch[fill] (its gate, then its up).
  uint16_t* next() { return scratch[fill]; }
  // That unit (rows of next()) becomes the pending one; the one before ends first.
  void post(int rows, uint16_t* dst, int64_t ld, int64_t k) {
    finish();
    src = scratch[fill], out = dst, ldo = ld, done = 0, total = 2 * rows;
    // Spread over the next unit's two panels of k / 32 steps each.
    per_step = std::max<int>(1, (total + k / 16 - 1) / (k / 16));
    fill ^= 1;
  }
};
#endif

#ifdef PAGODA_AMX
// With AMX the same panels are tile operands as they lie: rows kp .. kp + 15 of a
// panel, at a 128-byte stride, are the B tile of columns 0-15 (first 64 bytes of
// each row) or 16-31 (last 64). A is 16 rows x 32 k of x. Tiles: 0-3 C (row
// block b, column half h -> 2 b + h), 4-5 A, 6-7 B.
struct RowBlock {
  const uint16_t* x;  // 16 rows at stride k (a zero-padded copy for a short tail)
  int64_t first_row;
  int rows;
};

// The next row pair's x, fetched into L2 a few lines per k step while the
// current pair runs against the first group of panels: a prefill step's x comes
// from L3 or DRAM, and 16-row tile loads at a stride of K are no pattern for the
// hardware prefetcher.
struct RowPrefetch {
  const char* base[2] = {};
  int64_t lines[2] = {};
  int64_t done = 0;
  int per_step = 0;

  void step() {
    for (int n = 0; n < per_step; ++n, ++done) {
      const int part = done < lines[0] ? 0 : 1;
      const int64_t line = part == 0 ? done : done - lines[0];
      if (part == 1 && line >= lines[1]) return;
      _mm_prefetch(base[part] + 64 * line, _MM_HINT_T1);
    }
  }
};

// One or two 16-row blocks x one panel, over all of K (a multiple of 32); out
// points at the first block's first row.
// pipe (may be null): a pending SiLU, advanced at each k step while the tile
// products run. prefetch: the panel is cold (the first row pair of a chunk to
// meet it); later row pairs find it in L2.
template <int kBlocks>
void amx_panel_block(const RowBlock* blocks, int64_t k, const uint16_t* panel, const float* bias, uint16_t* out,
                     int64_t ldo, SiluPipe* pipe, bool prefetch, RowPrefetch* ahead) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kBlocks == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t ldx = k * 2;
  for (int64_t kk = 0; kk < k; kk += 32) {
    const uint16_t* b = panel + kk * kPanel;  // k pair kk / 2
    // The whole 2 KB of B four steps (8 KB) ahead: weights stream from DRAM at
    // decode sizes, and the hardware prefetcher alone left 40% of the read
    // bandwidth unused (30 SmolLM2 layers at 32 rows: 26 -> 16 ms).
    if (prefetch)
      for (int line = 0; line < 32; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(b + 4 * 32 * kPanel) + 64 * line, _MM_HINT_T0);
    // B with the streaming hint (tileloaddt1), so the panel passing through does
    // not evict the row pair's A from L1, which at K = 576 (36 KB) then serves
    // every panel of the group. Both changes together, at 4096 rows of 10 SmolLM2
    // layers on an AMX Xeon (family 6 model 167), 5 alternating passes: qkv 20.4
    // -> 18.3 ms, o 10.7 -> 9.4, gate/up 66.2 -> 54.4 (2.7 TFLOP/s), down (K =
    // 1536: A is 96 KB) 31.6 -> 31.9; either alone: 1.01x and 0.97x the time.
    _tile_stream_loadd(6, b, 128);
    _tile_stream_loadd(7, b + kPanel, 128);
    _tile_loadd(4, blocks[0].x + kk, ldx);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kBlocks == 2) {
      _tile_loadd(5, blocks[1].x + kk, ldx);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (pipe != nullptr) pipe->step(pipe->per_step);
    if (ahead != nullptr) ahead->step();
  }
  alignas(64) float c[kBlocks][16][kPanel];
  _tile_stored(0, &c[0][0][0], kPanel * 4);
  _tile_stored(1, &c[0][0][16], kPanel * 4);
  if constexpr (kBlocks == 2) {
    _tile_stored(2, &c[1][0][0], kPanel * 4);
    _tile_stored(3, &c[1][0][16], kPanel * 4);
  }
  const __m512 b0 = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias != nullptr ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
  for (int blk = 0; blk < kBlocks; ++blk)
    for (int r = 0; r < blocks[blk].rows; ++r) {
      uint16_t* o = out + (blocks[blk].first_row - blocks[0].first_row + r) * ldo;
      const __m512 v0 = _mm512_add_ps(_mm512_load_ps(&c[blk][r][0]), b0);
      const __m512 v1 = _mm512_add_ps(_mm512_load_ps(&c[blk][r][16]), b1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), (__m256i)_mm512_cvtneps_pbh(v0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), (__m256i)_mm512_cvtneps_pbh(v1));
    }
}

constexpr int64_t kRowSplitWeightBytes = 1280 * 1024;
constexpr int64_t kPanelMajorBlocks = 4;

template <typename Unit>
void amx_linear(const uint16_t* x, int64_t m, int64_t k, int64_t units, int64_t panels_per_unit, Unit&& unit) {
  // A tile reads 16 whole rows: a short tail runs from a zero-padded copy.
  std::vector<uint16_t> tail;
  std::vector<RowBlock> blocks;
  for (int64_t r = 0; r + 16 <= m; r += 16) blocks.push_back({x + r * k, r, 16});
  if (m % 16 != 0) {
    const int64_t first = m / 16 * 16;
    tail.assign(16 * k, 0);
    std::memcpy(tail.data(), x + first * k, (m - first) * k * 2);
    blocks.push_back({tail.data(), first, static_cast<int>(m - first)});
  }
  // Many rows: a chunk of x that stays in L2 (about 512 KB) runs against all of
  // a thread's panels before the next; otherwise every panel would stream all of x.
  // Within a chunk, a row pair runs against a group of units (panels filling
  // about 1 MB: with the chunk, 1.5 MB of the AMX Xeons' 2 MB L2) before the
  // next pair, so out is written along its rows. Unit by unit, each 32-row call
  // stored one 64-byte line per row, a column walking down out: 25-30% of a
  // 4096-row call went to those stores (Emerald Rapids), and groups take
  // 0.66-0.93x the time of that order per SmolLM2 linear there.
  const int64_t nb = static_cast<int64_t>(blocks.size());
  const int64_t chunk = std::max<int64_t>(2, (512 * 1024) / (k * 2 * 16) / 2 * 2);  // blocks, even
  // A few row pairs (decode): panel by panel instead, every pair right after
  // the first, so the weight streams from DRAM the whole time; a group made the
  // second pair's pass over it run from L2 with no DRAM read under way (the
  // 49152-row LM head at 64 rows took 1.75x a plain read of its bytes).
  const int64_t group = nb <= kPanelMajorBlocks ? 1 : std::max<int64_t>(1, (1 << 20) / (k * 2 * kPanel * panels_per_unit));
  // Blocks [b0, b1) (b0 even) against units [begin, end), on this thread.
  auto run = [&](int64_t b0, int64_t b1, int64_t begin, int64_t end) {
    SiluPipe pipe;
    with_tiles<true>([&] {
      for (int64_t c0 = b0; c0 < b1; c0 += chunk) {
        const int64_t c1 = std::min(b1, c0 + chunk);
        for (int64_t u0 = begin; u0 < end; u0 += group)
          for (int64_t i = c0; i < c1; i += 2) {
            const bool two = i + 1 < c1;
            const int rows = blocks[i].rows + (two ? blocks[i + 1].rows : 0);
            const int64_t u1 = std::min(end, u0 + group);
            // The first group meets each row pair first: it fetches the next.
            RowPrefetch ahead;
            const bool fetch = u0 == begin && i + 2 < b1;
            if (fetch) {
              for (int h = 0; h < 2 && i + 2 + h < b1; ++h) {
                ahead.base[h] = reinterpret_cast<const char*>(blocks[i + 2 + h].x);
                ahead.lines[h] = (blocks[i + 2 + h].rows * k * 2 + 63) / 64;
              }
              const int64_t steps = (u1 - u0) * panels_per_unit * (k / 32);
              ahead.per_step = static_cast<int>((ahead.lines[0] + ahead.lines[1] + steps - 1) / steps);
            }
            for (int64_t u = u0; u < u1; ++u)
              unit(u, blocks[i].first_row, rows, &pipe,
                   [&](const uint16_t* panel, const float* b, uint16_t* o, int64_t ldo) {
                     RowPrefetch* a = fetch ? &ahead : nullptr;
                     if (two)
                       amx_panel_block<2>(&blocks[i], k, panel, b, o, ldo, &pipe, i == c0, a);
                     else
                       amx_panel_block<1>(&blocks[i], k, panel, b, o, ldo, &pipe, i == c0, a);
                   });
          }
      }
      pipe.finish();
    });
  };
  // The threads split the units, so each reads all of x from L3 and half the
  // weight; where the whole weight fits in L2 beside a chunk, they split the rows
  // instead (each reads half of x and all of the weight, once). SmolLM2 at 4096
  // rows on an AMX Xeon (family 6 model 167), medians of 24 calls in two runs:
  // qkv (1.1 MB) 2.01-2.13 -> 1.62-1.74 ms, o (0.66 MB) 1.02-1.07 -> 0.87; by
  // rows gate/up (3.5 MB) took 0.96-0.99x the time (within the host's noise) and
  // down (1.8 MB, K = 1536: its weight re-read per chunk) 1.05-1.09x, so weights
  // past 1.25 MB keep the units.
  const int64_t threads = at::get_num_threads();
  if (units * panels_per_unit * kPanel * k * 2 <= kRowSplitWeightBytes && nb >= 8 * threads) {
    // Even block boundaries, so row pairs stay whole.
    auto first_block = [&](int64_t t) { return t == threads ? nb : nb * t / threads / 2 * 2; };
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) run(first_block(t), first_block(t + 1), 0, units);
    });
    return;
  }
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) { run(0, nb, begin, end); });
}
#endif  // PAGODA_AMX

}  // namespace

bool bf16_gemm_supported() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

torch::Tensor pack_bf16_panels(const torch::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && weight.dim() == 2, "pack_bf16_panels takes a 2-D bf16 weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kPanel == 0 && k % 2 == 0, "pack_bf16_panels: [", n, ", ", k, "] needs N % 32 == 0 and even K");
  const torch::Tensor w = weight.contiguous();
  auto packed = torch::empty({n / kPanel, k / 2, 2 * kPanel}, weight.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr());
  at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t kp = 0; kp < k / 2; ++kp)
        for (int c = 0; c < kPanel; ++c) {
          uint16_t* d = dst + ((p * (k / 2) + kp) * kPanel + c) * 2;
          const uint16_t* s = src + (p * kPanel + c) * k + 2 * kp;
          d[0] = s[0];
          d[1] = s[1];
        }
  });
  return packed;
}

namespace {

// out = x W^T + b, or with silu (W = [gate; up], each a whole number of panels)
// silu(x W_gate^T + b_gate) * (x W_up^T + b_up), both halves rounded to bf16
// first, as the unfused linear and silu_and_mul round them.
torch::Tensor panel_linear(const torch::Tensor& x, const torch::Tensor& packed,
                           const std::optional<torch::Tensor>& bias, bool silu) {
  TORCH_CHECK(bf16_gemm_supported(), "bf16_panel_linear needs a build with AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be contiguous bf16 [rows, in]");
  TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.dim() == 3 && packed.size(2) == 2 * kPanel &&
                  packed.is_contiguous(),
              "packed must come from pack_bf16_panels");
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0), n = panels * kPanel;
  TORCH_CHECK(packed.size(1) * 2 == k, "x has ", k, " columns, the weight ", packed.size(1) * 2);
  TORCH_CHECK(!silu || panels % 2 == 0, "bf16_panel_linear_silu: gate and up must be whole panels (N % 64 == 0)");
  auto out = torch::empty({m, silu ? n / 2 : n}, x.options());
  torch::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have ", n, " values");
    bias_f32 = bias->to(torch::kFloat).contiguous();
  }
#ifdef __AVX512BF16__
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float* bp = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  const int64_t units = silu ? panels / 2 : panels, n_out = units * kPanel;
  auto panel_of = [&](int64_t p) { return wp + p * (k / 2) * 2 * kPanel; };
  auto bias_of = [&](int64_t p) { return bp != nullptr ? bp + p * kPanel : nullptr; };
#ifdef PAGODA_AMX
  // Output unit u, rows [first, first + rows): `block(panel, bias, dst, ldd)` writes
  // those rows of one panel's product to dst. Plainly that is out's columns of
  // panel u; with silu, panels u (gate) and u + units (up) go to a scratch tile
  // side by side, whose silu(gate) * up is posted to the pipe, to run during the
  // next unit's products.
  auto unit = [&](int64_t u, int64_t first, int rows, SiluPipe* pipe, auto&& block) {
    if (!silu) return block(panel_of(u), bias_of(u), op + first * n_out + u * kPanel, n_out);
    uint16_t* scratch = pipe->next();
    block(panel_of(u), bias_of(u), scratch, 2 * kPanel);
    block(panel_of(u + units), bias_of(u + units), scratch + kPanel, 2 * kPanel);
    pipe->post(rows, op + first * n_out + u * kPanel, n_out, k);
  };
  if (k % 32 == 0 && use_amx()) {
    amx_linear(xp, m, k, units, silu ? 2 : 1, unit);
    return out;
  }
#endif
  // vdpbf16ps (panel_block_dp.h): units of two panels, 64 columns of out or, with
  // silu, a unit's gate and up panels side by side in a scratch block, then
  // silu(gate) * up to its 32 columns. Plainly unit q is panels 2q and 2q + 1
  // (the last alone when N / 32 is odd).
  // Few rows of a plain linear with few panels (decode's o and down: 18) go one
  // panel a unit instead, in blocks of up to 12 rows: the units are what the
  // threads share out, and 9 units over 2 threads left one idle for a ninth of
  // the call (SmolLM2's o and down at 12-36 rows on a Zen 4: 1.06x the time of
  // single panels).
  const int64_t threads = at::get_num_threads();
  const bool chunked = m * k * 2 > kChunkAbove;
  const int per_unit = silu || chunked || panels >= 16 * threads ? 2 : 1;
  const int max_rows = per_unit == 2 ? pagoda_dp::kMaxRows<2> : pagoda_dp::kMaxRows<1>;
  const int64_t dp_units = silu ? units : (panels + per_unit - 1) / per_unit;
  // Unit q's panels and biases; returns how many (1 or 2).
  auto unit_panels = [&](int64_t q, const uint16_t** p, const float** b) {
    const int64_t first = silu ? q : per_unit * q, second = silu ? q + units : first + 1;
    p[0] = panel_of(first), b[0] = bias_of(first);
    if (per_unit == 1 || second == panels) return 1;
    p[1] = panel_of(second), b[1] = bias_of(second);
    return 2;
  };
  // Rows [first, first + rows) of unit q, prefetching pf into L2 along the way.
  auto dp_unit = [&](int64_t q, int64_t first, int rows, const pagoda_dp::PanelPrefetch& pf, bool stream) {
    const uint16_t* p[2] = {nullptr, nullptr};
    const float* b[2] = {nullptr, nullptr};
    const uint16_t* xr = xp + first * k;
    uint16_t* dst = op + first * n_out + per_unit * q * kPanel;
    if (unit_panels(q, p, b) == 1) return pagoda_dp::run_block<1>(rows, xr, k, p, b, dst, n_out, pf, stream);
    if (!silu) return pagoda_dp::run_block<2>(rows, xr, k, p, b, dst, n_out, pf, stream);
    alignas(64) uint16_t scratch[pagoda_dp::kMaxRows<2> * 2 * kPanel];
    pagoda_dp::run_block<2>(rows, xr, k, p, b, scratch, 2 * kPanel, pf, false);
    dst = op + first * n_out + q * kPanel;
    for (int v = 0; v < 2 * rows; ++v) silu_and_mul_vector(scratch, v, dst, n_out);
  };
  // Even blocks of at most max_rows rows (32 rows at 6: 6 + 6 + 5 + 5 + 5 + 5, not
  // 5 x 6 + 2): a short block pays the same panel loads for fewer products.
  auto block_rows = [&](int64_t left) {
    const int64_t blocks = (left + max_rows - 1) / max_rows;
    return static_cast<int>((left + blocks - 1) / blocks);
  };
  // Many rows (prefill): x outgrows L2, and panel-major order would stream all
  // of it from L3 once per panel. Chunks of rows that stay in L2 go out instead,
  // each running against every panel (the weight, a few MB, then streams from
  // L3 once per chunk, at hundreds of FLOPs per byte).
  const int64_t chunk_rows = std::max<int64_t>(max_rows, kChunkBytes / (2 * k) / max_rows * max_rows);
  if (chunked) {
    // A multiple of the thread count, so no thread idles through a lone last chunk.
    const int64_t chunks = ((m + chunk_rows - 1) / chunk_rows + threads - 1) / threads * threads;
    const int64_t rows_per_chunk = (m + chunks - 1) / chunks;
    std::atomic<int64_t> next_chunk{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      for (int64_t c = next_chunk++; c * rows_per_chunk < m; c = next_chunk++) {
        const int64_t r0 = c * rows_per_chunk, r1 = std::min(m, r0 + rows_per_chunk);
        for (int64_t q = 0; q < dp_units; ++q)
          for (int64_t r = r0; r < r1;) {
            const int rows = block_rows(r1 - r);
            dp_unit(q, r, rows, {}, false);
            r += rows;
          }
      }
    });
    return out;
  }
  const int64_t nb = (m + max_rows - 1) / max_rows;
  // Block j of a unit prefetches slice j of the panels of a unit the thread does
  // later into L2, so the weight stream overlaps the blocks that compute from
  // cache. Without it the first block of each panel waited on DRAM (SmolLM2
  // gate/up at 32 rows, cold: 636 GFLOP/s, against 908 with the weight in cache).
  // Units go out through an atomic counter, each thread holding the unit it
  // works on, the next one (whose panels are already in L2) and one more, claimed
  // as it starts a unit, whose panels it prefetches: these cores run at uneven
  // speeds, and with static halves one waited at the end of every linear. Two
  // ahead rather than one: 30 SmolLM2 layers, weights cold, 0.95-0.98x at 1-64
  // rows (a thread's second unit gets no software prefetch).
  const int64_t panel_lines = k * kPanel * 2 / 64;
  const int64_t per = (panel_lines + nb - 1) / nb;
  auto slice = [&](int64_t q, int64_t j) {
    pagoda_dp::PanelPrefetch pf;
    if (q >= dp_units) return pf;
    const uint16_t* p[2] = {nullptr, nullptr};
    const float* b[2];
    const int count = unit_panels(q, p, b);
    const int64_t begin = std::min(j * per, panel_lines);
    pf.at = reinterpret_cast<const char*>(p[0]) + 64 * begin, pf.lines = std::min(per, panel_lines - begin);
    if (count == 2) pf.second = reinterpret_cast<const char*>(p[1]) - reinterpret_cast<const char*>(p[0]);
    return pf;
  };
  const bool stream = !silu && m * n_out * 2 > kStreamAbove && reinterpret_cast<uintptr_t>(op) % 64 == 0;
  std::atomic<int64_t> next_unit{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t q = next_unit++, a1 = next_unit++; q < dp_units;) {
      const int64_t after = next_unit++;
      for (int64_t r = 0, j = 0; r < m; ++j) {
        const int rows = block_rows(m - r);
        dp_unit(q, r, rows, slice(after, j), stream);
        r += rows;
      }
      q = a1;
      a1 = after;
    }
    if (stream) _mm_sfence();  // the streamed lines visible before the linear returns
  });
#else
  (void)silu;
#endif
  return out;
}

}  // namespace

torch::Tensor bf16_panel_linear(const torch::Tensor& x, const torch::Tensor& packed,
                                const std::optional<torch::Tensor>& bias) {
  return panel_linear(x, packed, bias, false);
}

torch::Tensor bf16_panel_linear_silu(const torch::Tensor& x, const torch::Tensor& packed,
                                     const std::optional<torch::Tensor>& bias) {
  return panel_linear(x, packed, bias, true);
}
