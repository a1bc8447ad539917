// bf16 linears for 1-6 rows (batch-1..6 decode and the LM head of a few
// sequences) on CPUs with AVX512-BF16, over the panels pack_bf16_panels made at
// load (gemm_bf16.cpp; no second copy of the weights).
//
// At 1-6 rows a linear is a read of its weight: a few FLOPs per byte, so all
// that counts is how fast the bytes stream in from DRAM. The panel kernel's
// many-row machinery costs here: its blocks run one panel at a time (two
// accumulator chains at one row), prefetch the next panel into L2 slice by
// slice, and convert the bias to float32 in a fresh tensor per call. Here:
// * 2-4 panels at once (as many streams, 8-24 independent vdpbf16ps chains),
// * every line prefetched kAheadBytes ahead in its own stream (the hardware
//   prefetcher alone stops at page ends and keeps too few lines in flight),
//   non-temporal on AMD and T0 on Intel (stream_prefetch.h: on a Zen 5 one
//   stream's step minus the GEMVs went 1.43-1.50 -> 1.15-1.24 ms a token with
//   NTA; on an AMX Xeon NTA cut the GEMVs' read to a third),
// * pairs of panels handed out through an atomic counter, so a thread that the
//   (shared, loaded) host descheduled does not hold the linear up at its end,
// * the bias widened from bf16 in registers, no allocation but the output.
// Each column's sum runs in the panel kernel's order (bias first, then k pairs
// in order), so for any K both kernels' vdpbf16ps paths agree bit for bit.
//
// Shapes:
//   x:      [M, K] bf16 contiguous, 1 <= M <= 6
//   packed: [N / 32, K / 2, 64] bf16 (pack_bf16_panels)
//   bias:   [N] bf16 or None
//   out:    [M, N] bf16; gemv_bf16_linear_silu (packed [gate; up], N % 64 == 0):
//           [M, N / 2] = silu(x gate^T + b_gate) * (x up^T + b_up), each half
//           rounded to bf16 first as silu_and_mul sees it (bit for bit the
//           linear then silu_and_mul).
// The plain twins are F.linear and F.linear then SiluAndMul
// (tests/kernels/test_cpu_gemv_bf16.py).
#include <torch/python.h>
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>

#include "linear_fn.h"
#include "stream_prefetch.h"
#include "vec16.h"

namespace {

constexpr int kPanel = 32;     // output columns per panel (pack_bf16_panels)
constexpr int kMaxRows = 6;    // 24 accumulators at two panels: room for w and x in 32 registers
constexpr int kAheadBytes = 2048;

#ifdef __AVX512BF16__
// 16 bf16 -> float32, exact (bf16 is the high half of a float32).
inline __m512 widen16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// kRows x 32 columns of kPanels panels, over all of K: dst[p] + r * ldd gets row
// r of panel p's product (+ bias[p], bf16 [32] or null).
template <int kRows, int kPanels, bool kNta>
inline void panels_rows(const uint16_t* x, int64_t k, const uint16_t* const* panel,
                        const uint16_t* const* bias, uint16_t* const* dst, int64_t ldd) {
  __m512 acc[kPanels][kRows][2];
  for (int p = 0; p < kPanels; ++p) {
    const __m512 b0 = bias[p] != nullptr ? widen16(bias[p]) : _mm512_setzero_ps();
    const __m512 b1 = bias[p] != nullptr ? widen16(bias[p] + 16) : _mm512_setzero_ps();
    for (int r = 0; r < kRows; ++r) acc[p][r][0] = b0, acc[p][r][1] = b1;
  }
  for (int64_t kp = 0; kp < k / 2; ++kp) {
    __m512bh xv[kRows];
    for (int r = 0; r < kRows; ++r) {
      uint32_t pair;
      std::memcpy(&pair, x + r * k + 2 * kp, 4);
      xv[r] = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
    }
    for (int p = 0; p < kPanels; ++p) {
      const uint16_t* w = panel[p] + kp * 2 * kPanel;  // 128 bytes: two lines
      const char* ahead = reinterpret_cast<const char*>(w) + kAheadBytes;
      prefetch_weight_line(ahead, kNta);
      prefetch_weight_line(ahead + 64, kNta);
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + kPanel);
      for (int r = 0; r < kRows; ++r) {
        acc[p][r][0] = _mm512_dpbf16_ps(acc[p][r][0], xv[r], w0);
        acc[p][r][1] = _mm512_dpbf16_ps(acc[p][r][1], xv[r], w1);
      }
    }
  }
  for (int p = 0; p < kPanels; ++p)
    for (int r = 0; r < kRows; ++r) {
      uint16_t* o = dst[p] + r * ldd;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), (__m256i)_mm512_cvtneps_pbh(acc[p][r][0]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), (__m256i)_mm512_cvtneps_pbh(acc[p][r][1]));
    }
}

// At most 24 accumulators (kRows * kPanels <= 12); other pairs never run.
template <int kPanels>
void run_rows(int rows, const uint16_t* x, int64_t k, const uint16_t* const* panel, const uint16_t* const* bias,
              uint16_t* const* dst, int64_t ldd, bool nta) {
  switch (rows) {
#define PAGODA_ROWS(r)                                                          \
  case r:                                                                       \
    if constexpr (r * kPanels <= 12) {                                          \
      if (nta) return panels_rows<r, kPanels, true>(x, k, panel, bias, dst, ldd); \
      return panels_rows<r, kPanels, false>(x, k, panel, bias, dst, ldd);       \
    }                                                                           \
    break;
    PAGODA_ROWS(1) PAGODA_ROWS(2) PAGODA_ROWS(3) PAGODA_ROWS(4)
    PAGODA_ROWS(5) PAGODA_ROWS(6)
#undef PAGODA_ROWS
  }
  TORCH_CHECK(false, "gemv_bf16: ", rows, " rows at ", kPanels, " panels");
}

// Panels per work item: 4 at 1-2 rows (8-16 accumulators), 2 at 3-6 (12-24).
// At one row, 30 SmolLM2 layers + LM head streaming from DRAM on 2 threads of
// a Zen 5 (standalone loop, best of 9): 1 panel at a time 51-66 GB/s, 2 at a
// time 58-68, 4 at a time 65-83, a plain read of the same bytes 70-81.
// At 5-6 rows two panels of 5-6 rows beat the panel kernel's one panel of 5-6
// (bench/small_m_ab.py, SmolLM2 weights cold: one thread 0.85x a step's
// linears; 2 threads 0.65-0.95x per linear at 6 rows). At 7-8 rows neither one
// panel of 8 nor two in passes of 4 beat it on 2 threads, so 6 is the limit.
inline int group_of(int rows) { return rows <= 2 ? 4 : 2; }

void run_group(int group, int rows, const uint16_t* x, int64_t k, const uint16_t* const* panel,
               const uint16_t* const* bias, uint16_t* const* dst, int64_t ldd, bool nta) {
  if (group == 4) return run_rows<4>(rows, x, k, panel, bias, dst, ldd, nta);
  if (group == 2) return run_rows<2>(rows, x, k, panel, bias, dst, ldd, nta);
  return run_rows<1>(rows, x, k, panel, bias, dst, ldd, nta);
}
#endif

torch::Tensor gemv(const torch::Tensor& x, const torch::Tensor& packed, const std::optional<torch::Tensor>& bias,
                   bool silu) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be contiguous bf16 [rows, in]");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kMaxRows, "gemv_bf16 takes 1 to ", kMaxRows, " rows, not ", x.size(0));
  TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.dim() == 3 && packed.size(2) == 2 * kPanel &&
                  packed.is_contiguous(),
              "packed must come from pack_bf16_panels");
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0), n = panels * kPanel;
  TORCH_CHECK(packed.size(1) * 2 == k, "x has ", k, " columns, the weight ", packed.size(1) * 2);
  TORCH_CHECK(!silu || panels % 2 == 0, "gemv_bf16_linear_silu: gate and up must be whole panels (N % 64 == 0)");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->scalar_type() == torch::kBFloat16 && bias->numel() == n && bias->is_contiguous(),
                "bias must be contiguous bf16 with ", n, " values");
  const int64_t n_out = silu ? n / 2 : n;
  auto out = torch::empty({m, n_out}, x.options());
#ifdef __AVX512BF16__
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const auto* bp = has_bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr()) : nullptr;
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int rows = static_cast<int>(m);
  const bool nta = stream_weights_nta();
  auto panel_of = [&](int64_t p) { return wp + p * (k / 2) * 2 * kPanel; };
  auto bias_of = [&](int64_t p) { return bp != nullptr ? bp + p * kPanel : nullptr; };
  // Work item i: plainly panels [g i, g i + g) (g = group_of(rows); a short
  // last item one panel at a time); with silu, gate panels [h i, h i + h) (h =
  // g / 2) and their up panels, h units later.
  const int group = group_of(rows), per_item = silu ? group / 2 : group;
  const int64_t units = silu ? panels / 2 : panels, items = (units + per_item - 1) / per_item;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    const uint16_t* pan[4];
    const uint16_t* bi[4];
    uint16_t* dst[4];
    for (int64_t i = next++; i < items; i = next++) {
      const int64_t u0 = i * per_item;
      const int here = static_cast<int>(std::min<int64_t>(per_item, units - u0));
      if (!silu) {
        for (int j = 0; j < here; ++j)
          pan[j] = panel_of(u0 + j), bi[j] = bias_of(u0 + j), dst[j] = op + (u0 + j) * kPanel;
        if (here == group) {
          run_group(group, rows, xp, k, pan, bi, dst, n_out, nta);
        } else {
          for (int j = 0; j < here; ++j) run_group(1, rows, xp, k, pan + j, bi + j, dst + j, n_out, nta);
        }
        continue;
      }
      // Per row: [gate 32 | up 32] for each unit of the item.
      alignas(64) uint16_t scratch[2][kMaxRows * 2 * kPanel];
      for (int j = 0; j < here; ++j) {
        pan[j] = panel_of(u0 + j), bi[j] = bias_of(u0 + j), dst[j] = scratch[j];
        pan[here + j] = panel_of(u0 + j + units), bi[here + j] = bias_of(u0 + j + units);
        dst[here + j] = scratch[j] + kPanel;
      }
      run_group(2 * here, rows, xp, k, pan, bi, dst, 2 * kPanel, nta);
      for (int j = 0; j < here; ++j)
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < kPanel; c += kLanes) {
            const uint16_t* g = scratch[j] + r * 2 * kPanel + c;
            const vec16 gv = load(reinterpret_cast<const at::BFloat16*>(g));
            const vec16 uv = load(reinterpret_cast<const at::BFloat16*>(g + kPanel));
            store_bf16(op + r * n_out + (u0 + j) * kPanel + c, silu_mul_bf16(gv, uv));
          }
    }
  });
#else
  TORCH_CHECK(false, "gemv_bf16 needs a build with AVX512-BF16");
#endif
  return out;
}

}  // namespace

bool gemv_bf16_supported() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

torch::Tensor gemv_bf16_linear(const torch::Tensor& x, const torch::Tensor& packed,
                               const std::optional<torch::Tensor>& bias) {
  return gemv(x, packed, bias, false);
}

torch::Tensor gemv_bf16_linear_silu(const torch::Tensor& x, const torch::Tensor& packed,
                                    const std::optional<torch::Tensor>& bias) {
  return gemv(x, packed, bias, true);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv_bf16_supported", &gemv_bf16_supported, "Whether this build has the AVX512-BF16 GEMV");
  m.attr("max_rows") = kMaxRows;
  m.def("gemv_bf16_linear", &gemv_bf16_linear, "x [1-6, K] @ packed^T (+ bias) -> [M, N] bf16", py::arg("x"),
        py::arg("packed"), py::arg("bias") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("gemv_bf16_linear_silu", &gemv_bf16_linear_silu,
        "silu(x @ gate^T + b) * (x @ up^T + b) for packed [gate; up], x [1-6, K] -> [M, N / 2] bf16",
        py::arg("x"), py::arg("packed"), py::arg("bias") = py::none(), py::call_guard<py::gil_scoped_release>());
  // The same two for decode_stack.cpp's native loop (linear_fn.h).
  m.attr("gemv_bf16_linear_fn") = linear_fn_capsule(&gemv_bf16_linear);
  m.attr("gemv_bf16_linear_silu_fn") = linear_fn_capsule(&gemv_bf16_linear_silu);
}
