// bf16 linear layers (y = x W^T + b) on CPUs with AVX512-BF16 or AMX, from
// weights packed once at load into 32-column panels.
//
// At decode batch sizes (8-64 rows) a linear streams its whole weight from DRAM
// for a few FLOPs per byte. Here each panel ([K/2][32 columns][2]) is one
// contiguous stream, and a block of rows of x runs against it:
// * AMX (K a multiple of 32; panel_block_amx.h): one or two 16-row tiles of x
//   against the panel's two 16-column B tiles, four C tiles. On a 2-core Xeon
//   with AMX (30 SmolLM2 layers at 32 rows, weights cold) 16 vs 39 ms for
//   oneDNN's prepacked linear; level with it from 256 to 2048 rows (610-740 vs
//   620-800 GFLOP/s per shape). The vdpbf16ps loop (then 12 rows x one panel)
//   ran at 135 GFLOP/s there.
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
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <vector>

#include "amx.h"
#include "panel_block_amx.h"
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
    pagoda_amx::amx_linear<SiluPipe>(xp, m, k, units, silu ? 2 : 1, unit);
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
