// Float32 linears for 1-8 rows over half-stored weights (bf16 or fp16), on
// CPUs without fast bf16 arithmetic (AVX2-only x86), where the engine computes
// in float32 (worker/runner/platform.py).
//
// At 1-8 rows a linear is a read of its weight, so its time is the bytes as
// stored over the memory bandwidth: half storage halves them. The halves
// widen to floats in registers (half_panel.h; bf16: a shift or a mask, fp16:
// F16C's vcvtph2ps), both exact, so the products are those of the float32
// weights. It reads the panels gemm_half_f32.cpp's pack_half_panels made at load
// ([N / 16, K, 16]: 16 columns, K-major, one sequential stream per panel), so
// the engine keeps one copy of the weights. Unlike that kernel's few-row path:
// * k steps dealt round-robin to 1-4 accumulator sets: 8-12 independent FMA
//   chains at every row count (1 row had 4), within AVX2's 16 registers,
// * rows 5-8 run as two row groups per panel, the first with each line
//   prefetched kAheadBytes ahead; the second re-reads the panel from L1/L2, so
//   the weights stream from DRAM once per call (that kernel runs 1 panel x 6
//   rows, then the next rows over the panel again, with no prefetch),
// * x packed per row group as [K, rows] (one broadcast stream, not one per row),
// * runs of panels handed out through an atomic counter, so a thread the
//   (shared, loaded) host descheduled does not hold the linear up at its end.
// Measured (bench/avx2_gemv_f32.py, emulated AVX2 on a Zen 5, one thread, CPU
// time, load 4-7): SmolLM2's 30 layers + LM head, that kernel's time x 0.77 at
// 8 rows, 0.77 at 4, 0.91 at 2, level at 1 (9.1 ms: 82-91% of a plain AVX2
// read of the bf16 bytes, where oneDNN float32 took 24.4 ms).
// Tried: 2-4 panels at once (as gemv_bf16.cpp does) and T0 prefetch at 1-4 rows:
// 1 row 11.2-13.3 ms, 2 rows 12.4-19.1 (vs 9.8, 11.5) on that Zen 5. At 1-4
// rows the lines are prefetched non-temporal on AMD instead (a weight is read
// once a step; without the hint the step's weights flushed L2/L3 of what the
// kernels between the linears use): one stream, emulated AVX2 on a Zen 5, 2
// threads, 8 alternating rounds of 256 tokens: step 0.924x the time, the
// linears alone 6.62 -> 6.11 ms a pass (median). On Intel, T0 (stream_prefetch.h:
// NTA there read at two thirds of T0's rate). On a real Zen 3, 2 threads, the
// 30 layers + LM head at one row: 12.8-14.0 ms a pass (best), 19-25 GB/s of the
// bf16 bytes per linear where torch's float32 sum reads ~25; prefetcht2 instead
// of NTA and 4 KB ahead instead of 1 KB made no difference (stream_prefetch.h).
// Each column's k steps are summed in U partial sums, added, then the bias:
// the twin is F.linear(x, weight.float(), bias), equal up to float32 summation
// order (tests/kernels/test_cpu_gemv_f32.py).
//
// Shapes: x [M, K] float32 contiguous, 1 <= M <= 8; packed [N / 16, K, 16]
// bf16/fp16; bias [N] float32 or None; out [M, N] float32.
#include <torch/python.h>
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGODA_GEMV_F32 1
#include <immintrin.h>

#include "half_panel.h"
#include "stream_prefetch.h"
#endif

#include "linear_fn.h"

namespace {

constexpr int kPanel = 16;  // output columns per panel (pack_half_panels)
constexpr int kMaxRows = 8;
constexpr int kRowGroup = 4;  // rows per pass over a panel: 8 accumulators
constexpr int kAheadBytes = 1024;
constexpr int64_t kChunksPerThread = 4;

#ifdef PAGODA_GEMV_F32
static_assert(kPanel == pagoda_half::kPanel);

// R rows of one panel: dst + r * ldo gets row r's 16 outputs (+ bias, float32
// [16] or null). x's (row r, k) is at x[k * R + r] (pack_row_groups). U sets of accumulators take the k
// steps in turn (2R x U independent FMA chains), added at the end.
template <bool kBf16, int R, int U, bool kNta>
inline void panel_rows(const float* x, int64_t k_len, const uint16_t* panel, const float* bias, float* dst,
                       int64_t ldo) {
  static_assert(R * U <= 6 && (U == 1 || U == 2 || U == 4), "2 R U accumulators must fit in 12 registers");
  constexpr int S = U == 4 ? 4 : 2;  // k steps per iteration: whole 64-byte lines
  __m256 acc[U][R][2];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
  auto step = [&](int64_t k, int u) __attribute__((always_inline)) {
    __m256 lo, hi;
    pagoda_half::widen16<kBf16>(panel + k * kPanel, lo, hi);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + k * R + r);
      acc[u][r][0] = _mm256_fmadd_ps(a, lo, acc[u][r][0]);
      acc[u][r][1] = _mm256_fmadd_ps(a, hi, acc[u][r][1]);
    }
  };
  int64_t k = 0;
  for (; k + S <= k_len; k += S) {
#pragma GCC unroll 2
    for (int l = 0; l < S / 2; ++l)  // two k steps = one 64-byte line
      prefetch_weight_line(reinterpret_cast<const char*>(panel + k * kPanel) + kAheadBytes + 64 * l, kNta);
#pragma GCC unroll 4
    for (int j = 0; j < S; ++j) step(k + j, j % U);
  }
  for (; k < k_len; ++k) step(k, 0);
  const __m256 b0 = bias != nullptr ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  const __m256 b1 = bias != nullptr ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m256 s0 = acc[0][r][0], s1 = acc[0][r][1];
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) s0 = _mm256_add_ps(s0, acc[u][r][0]), s1 = _mm256_add_ps(s1, acc[u][r][1]);
    _mm256_storeu_ps(dst + r * ldo, _mm256_add_ps(s0, b0));
    _mm256_storeu_ps(dst + r * ldo + 8, _mm256_add_ps(s1, b1));
  }
}

// Per row count, U sets so that each k step has 8-12 independent FMA chains.
template <bool kBf16, bool kNta>
void run_rows(int rows, const float* x, int64_t k_len, const uint16_t* panel, const float* bias, float* dst,
              int64_t ldo) {
  switch (rows) {
    case 1: return panel_rows<kBf16, 1, 4, kNta>(x, k_len, panel, bias, dst, ldo);
    case 2: return panel_rows<kBf16, 2, 2, kNta>(x, k_len, panel, bias, dst, ldo);
    case 3: return panel_rows<kBf16, 3, 2, kNta>(x, k_len, panel, bias, dst, ldo);
    default: return panel_rows<kBf16, 4, 1, kNta>(x, k_len, panel, bias, dst, ldo);
  }
}

// x [rows, K] -> row groups of up to kRowGroup rows, each [K, its rows]: the
// micro-kernel's broadcasts then read one sequential stream, not one per row
// (at 2-4 rows, down_proj's K = 1536 rows of x, 6 KB apart, ran at 62% and 38%
// of the read bandwidth where qkv's ran at 80% and 60%).
const float* pack_row_groups(const float* x, int rows, int64_t k_len) {
  if (rows == 1) return x;
  static thread_local std::vector<float> packed;  // reused: no allocation per call
  packed.resize(rows * k_len);
  for (int r0 = 0; r0 < rows; r0 += kRowGroup) {
    const int r = std::min(kRowGroup, rows - r0);
    float* dst = packed.data() + r0 * k_len;
    for (int64_t k = 0; k < k_len; ++k)
      for (int i = 0; i < r; ++i) dst[k * r + i] = x[(r0 + i) * k_len + k];
  }
  return packed.data();
}

template <bool kBf16>
void gemv(const float* x_rows, int rows, int64_t k_len, const uint16_t* packed, int64_t panels, const float* bias,
          float* out) {
  const int64_t n = panels * kPanel;
  const float* x = pack_row_groups(x_rows, rows, k_len);
  // 5-8 rows: prefetched into the caches, from which the second row group
  // re-reads the panel; 1-4 rows: one pass, prefetched non-temporal on AMD
  // (stream_prefetch.h; on Intel T0 as 5-8 rows).
  const bool two_groups = rows > kRowGroup, nta = stream_weights_nta();
  // Contiguous runs of panels, kChunksPerThread per thread, from an atomic
  // counter. One panel per fetch (0.5-1 us of work at one row) ran at 0.6x the
  // static split's speed on 2 threads: the counter's line moving between cores
  // on every fetch.
  const int64_t threads = at::get_num_threads();
  const int64_t chunk = std::max<int64_t>(1, panels / (threads * kChunksPerThread));
  const int64_t chunks = (panels + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const int64_t end = std::min(panels, (c + 1) * chunk);
      for (int64_t p = c * chunk; p < end; ++p) {
        const uint16_t* panel = packed + p * k_len * kPanel;
        const float* b = bias != nullptr ? bias + p * kPanel : nullptr;
        // 5-8 rows: the first four stream the panel in, the rest read it from cache.
        for (int r0 = 0; r0 < rows; r0 += kRowGroup) {
          const int r = std::min(kRowGroup, rows - r0);
          float* dst = out + r0 * n + p * kPanel;
          if (two_groups || !nta)
            run_rows<kBf16, false>(r, x + r0 * k_len, k_len, panel, b, dst, n);
          else
            run_rows<kBf16, true>(r, x + r0 * k_len, k_len, panel, b, dst, n);
        }
      }
    }
  });
}
#endif

}  // namespace

bool gemv_f32_supported() {
#ifdef PAGODA_GEMV_F32
  return true;
#else
  return false;
#endif
}

int64_t gemv_f32_max_rows() { return kMaxRows; }

// x [M, K] float32 @ packed^T (+ bias float32 [N]) -> [M, N] float32, 1 <= M <= 8.
torch::Tensor gemv_half_f32_linear(const torch::Tensor& x, const torch::Tensor& packed,
                                   const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(gemv_f32_supported(), "gemv_half_f32_linear: this build has no AVX2+FMA+F16C");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 2 && x.is_contiguous(),
              "gemv_half_f32_linear: x must be a contiguous float32 [M, K]");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kMaxRows, "gemv_half_f32_linear takes 1 to ", kMaxRows,
              " rows, not ", x.size(0));
  const bool bf16 = packed.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16 || packed.scalar_type() == torch::kHalf) && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == kPanel && packed.size(1) == x.size(1),
              "gemv_half_f32_linear: packed must be pack_half_panels' [N / 16, K, 16] with K = x's");
  const int64_t k = x.size(1), panels = packed.size(0);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat && bias->is_contiguous() && bias->numel() == panels * kPanel,
                "gemv_half_f32_linear: bias must be a contiguous float32 [N]");
    b = bias->data_ptr<float>();
  }
  auto out = torch::empty({x.size(0), panels * kPanel}, x.options());
#ifdef PAGODA_GEMV_F32
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const int rows = static_cast<int>(x.size(0));
  if (bf16)
    gemv<true>(x.data_ptr<float>(), rows, k, w, panels, b, out.data_ptr<float>());
  else
    gemv<false>(x.data_ptr<float>(), rows, k, w, panels, b, out.data_ptr<float>());
#endif
  return out;
}

// Kernels run without the GIL (no Python object in their bodies), as in module.cpp.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv_f32_supported", &gemv_f32_supported, "Whether this build has the AVX2 half-storage GEMV");
  m.def("gemv_f32_max_rows", &gemv_f32_max_rows, "The most rows gemv_half_f32_linear takes");
  m.def("gemv_half_f32_linear", &gemv_half_f32_linear,
        "x [M <= 8, K] f32 @ widened half panels^T (+ bias) -> [M, N] f32", py::arg("x"), py::arg("packed"),
        py::arg("bias") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.attr("gemv_half_f32_linear_fn") = linear_fn_capsule(&gemv_half_f32_linear);  // linear_fn.h
}
