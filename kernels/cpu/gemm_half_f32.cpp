// Linear layers whose weights are STORED in half precision (bf16 or fp16) and
// computed in float32: for CPUs without fast bf16 arithmetic (AVX2-only x86),
// where the engine computes in float32 (worker/runner/platform.py).
//
// Why: a decode step at a few rows reads every weight once, so its time is the
// weight bytes over the memory bandwidth. Half storage halves those bytes; the
// halves widen to floats in registers (bf16: a shift or a mask; fp16: F16C's
// vcvtph2ps) right before the FMAs, as llama.cpp does on AVX2. Lossless for a
// bf16 or fp16 checkpoint: its values are what the float32 weights would hold.
//
// Layout: [N, K] -> [N / 16, K, 16] panels (pack_half_panels): one panel is 16
// output columns, K-major, so a k step reads 32 contiguous bytes and a panel is
// one sequential stream; a bf16 step's 16 columns are interleaved so that one
// load widens to both halves (half_panel.h). The micro-kernel keeps MR rows x
// 16 columns of accumulators (MR <= 6: 12 of AVX2's 16 registers); at 1-3
// rows, where one accumulator chain per column half would be FMA-latency
// bound, it keeps two chains over k and adds them at the end. From 9 rows the
// first row block widens the panel as it multiplies, into a thread-local
// float32 copy (L2-resident) that the other row blocks read, so the conversion
// is paid once per panel, inside FMA-bound work.
//
// half_panel_linear_silu: W = [gate; up] (each a whole number of panels), out
// [M, N / 2] = silu(x W_gate^T + b_gate) * (x W_up^T + b_up). A row block's
// gate and up tiles go side by side to a scratch tile and the SiLU reads them
// from L1: the [M, N] float32 product is never written and read back (at a
// 4096-row prefill step, 50 MB a layer).
//
// The plain-PyTorch twin is F.linear(x, weight.float(), bias) (then SiluAndMul);
// results match it up to float32 summation order, and the fused linear matches
// half_panel_linear then silu_and_mul_f32 bit for bit
// (tests/kernels/test_cpu_half_f32.py).
#include <torch/python.h>
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "linear_fn.h"
#include "vec16.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGODA_HALF_F32 1
#include <immintrin.h>

#include "half_panel.h"
#endif

namespace {

constexpr int kPanel = 16;       // output columns per panel (half_panel.h)
constexpr int kMaxRows = 6;      // rows per micro-kernel call
constexpr int64_t kWidenRows = 9;  // from this many rows, widen each panel once (cold: 0.81-0.95x the time at 9-11)
constexpr int64_t kBlockRows = 96;  // rows per pass over the panels (96 x K floats: L2)
constexpr int64_t kPassesPerThread = 2;  // from this many passes a thread, threads take whole passes

#ifdef PAGODA_HALF_F32
static_assert(kPanel == pagoda_half::kPanel);

// The B operand of one k step: 16 columns, from half bits or from floats.
template <typename B>
struct Panel;
template <>
struct Panel<float> {
  static inline void at(const float* p, __m256& lo, __m256& hi) {
    lo = _mm256_loadu_ps(p), hi = _mm256_loadu_ps(p + 8);
  }
};
template <bool kBf16>
struct HalfBits {};
template <bool kBf16>
struct Panel<HalfBits<kBf16>> {
  static inline void at(const uint16_t* p, __m256& lo, __m256& hi) { pagoda_half::widen16<kBf16>(p, lo, hi); }
};

// out[MR rows, 16] = x[MR rows, K] @ panel[K, 16] (+ bias). x's element (i, k)
// is at x[i * row_step + k * k_step]: row-major rows (row_step K, k_step 1) or
// a packed row block (row_step 1, k_step kMaxRows). The accumulators are named
// variables, not an array: GCC kept an array of them in memory and stored all
// twelve on every k step (measured: half of oneDNN's speed). With U = 2 a
// second set takes the odd k steps (two more independent FMA chains per
// column half: 1-3 rows are otherwise FMA-latency bound).
#define PAGODA_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
//
// `wide`, where given (a half panel only), receives the panel widened to float32
// as the k loop goes, for the row blocks after this one; `next` is then
// prefetched a line per two k steps (see half_linear).
template <int MR, int U, typename B, typename T>
void tile(const float* x, int64_t row_step, int64_t k_step, const T* panel, int64_t k_len, const float* bias,
          float* out, int64_t ldo, float* wide = nullptr, const char* next = nullptr) {
  static_assert(MR <= kMaxRows && (U == 1 || (U == 2 && MR <= 3)), "MR x U accumulators exceed the registers");
#define PAGODA_DECLARE(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = c##i##0, d##i##0 = c##i##0, d##i##1 = c##i##0;
  PAGODA_ROWS(PAGODA_DECLARE)
#undef PAGODA_DECLARE
#define PAGODA_STEP(acc, i)                                           \
  if constexpr (MR > i) {                                             \
    const __m256 a = _mm256_broadcast_ss(xk + i * row_step);          \
    acc##i##0 = _mm256_fmadd_ps(a, lo, acc##i##0);                    \
    acc##i##1 = _mm256_fmadd_ps(a, hi, acc##i##1);                    \
  }
#define PAGODA_C(i) PAGODA_STEP(c, i)
#define PAGODA_D(i) PAGODA_STEP(d, i)
  int64_t k = 0;
  if constexpr (U == 2)
    for (; k + 2 <= k_len; k += 2) {
      __m256 lo, hi;
      const float* xk = x + k * k_step;
      Panel<B>::at(panel + k * kPanel, lo, hi);
      PAGODA_ROWS(PAGODA_C)
      xk += k_step;
      Panel<B>::at(panel + (k + 1) * kPanel, lo, hi);
      PAGODA_ROWS(PAGODA_D)
    }
  if (wide != nullptr) {
    for (; k < k_len; ++k) {
      __m256 lo, hi;
      const float* xk = x + k * k_step;
      if (k % 2 == 0) _mm_prefetch(next + k * kPanel * 2, _MM_HINT_T1);
      Panel<B>::at(panel + k * kPanel, lo, hi);
      _mm256_storeu_ps(wide + k * kPanel, lo);
      _mm256_storeu_ps(wide + k * kPanel + 8, hi);
      PAGODA_ROWS(PAGODA_C)
    }
  }
  for (; k < k_len; ++k) {
    __m256 lo, hi;
    const float* xk = x + k * k_step;
    Panel<B>::at(panel + k * kPanel, lo, hi);
    PAGODA_ROWS(PAGODA_C)
  }
#undef PAGODA_C
#undef PAGODA_D
#undef PAGODA_STEP
  const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
#define PAGODA_STORE(i)                                                                           \
  if constexpr (MR > i) {                                                                         \
    if constexpr (U == 2) c##i##0 = _mm256_add_ps(c##i##0, d##i##0), c##i##1 = _mm256_add_ps(c##i##1, d##i##1); \
    _mm256_storeu_ps(out + i * ldo, _mm256_add_ps(c##i##0, b0));                                  \
    _mm256_storeu_ps(out + i * ldo + 8, _mm256_add_ps(c##i##1, b1));                              \
  }
  PAGODA_ROWS(PAGODA_STORE)
#undef PAGODA_STORE
}
#undef PAGODA_ROWS

// out[r, 0..16) = silu(gate) * up for `rows` scratch rows of [gate 16 | up 16].
void silu_rows(const float* scratch, int64_t rows, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < kPanel; c += kNativeLanes) {
      const float* g = scratch + r * 2 * kPanel + c;
      store_native(out + r * ldo + c, silu_mul_native(load_native(g), load_native(g + kPanel)));
    }
}

// A few rows (fewer than kWidenRows) against one panel, widened in registers.
template <bool kBf16>
void few_rows(const float* x, int64_t rows, const uint16_t* panel, int64_t k_len, const float* bias, float* out,
              int64_t ldo) {
  using B = HalfBits<kBf16>;
  for (int64_t m = 0; m < rows;) {
    const float* xm = x + m * k_len;
    float* om = out + m * ldo;
    switch (std::min<int64_t>(rows - m, kMaxRows)) {
      case 1: tile<1, 2, B>(xm, k_len, 1, panel, k_len, bias, om, ldo); m += 1; break;
      case 2: tile<2, 2, B>(xm, k_len, 1, panel, k_len, bias, om, ldo); m += 2; break;
      case 3: tile<3, 2, B>(xm, k_len, 1, panel, k_len, bias, om, ldo); m += 3; break;
      case 4: tile<4, 1, B>(xm, k_len, 1, panel, k_len, bias, om, ldo); m += 4; break;
      case 5: tile<5, 1, B>(xm, k_len, 1, panel, k_len, bias, om, ldo); m += 5; break;
      default: tile<6, 1, B>(xm, k_len, 1, panel, k_len, bias, om, ldo); m += 6; break;
    }
  }
}

// Row blocks of at most kMaxRows rows, evened out (37 rows: 5 x 5 + 2 x 6, not
// 6 x 6 + 1): every tile then has at least 8 FMA chains (4+ rows; from 9 rows),
// so none is latency bound, and no FMAs go to zero padding. A padded last block
// of 6 made a call at 37 rows take as long as one at 42 (bench/avx2_small_m_ab.py).
// Each row keeps its own accumulators over the same k order in any tile, so a
// row's result does not depend on the block it lands in.
struct RowBlock {
  int64_t first;
  int rows;
};

std::vector<RowBlock> even_blocks(int64_t rows) {
  const int64_t count = (rows + kMaxRows - 1) / kMaxRows;
  std::vector<RowBlock> blocks;
  for (int64_t b = 0, first = 0; b < count; ++b) {
    const int64_t end = rows * (b + 1) / count;
    blocks.push_back({first, static_cast<int>(end - first)});
    first = end;
  }
  return blocks;
}

// A block of x [rows, K] -> [K, kMaxRows] (its rows, then zeros): the
// micro-kernel then broadcasts from one sequential stream instead of six.
void pack_block(const float* x, const RowBlock& block, int64_t k_len, float* dst) {
  const float* src = x + block.first * k_len;
  const int n = block.rows;
  for (int64_t k = 0; k < k_len; ++k)
    for (int i = 0; i < kMaxRows; ++i) dst[k * kMaxRows + i] = i < n ? src[i * k_len + k] : 0.f;
}

void pack_rows(const float* x, const RowBlock* blocks, int64_t count, int64_t k_len, float* packed) {
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) pack_block(x, blocks[b], k_len, packed + b * k_len * kMaxRows);
  });
}

// One packed row block of `rows` (4-6, even_blocks' sizes from kWidenRows rows)
// rows against a panel: tile<rows>, from the half bits (widening into `wide` on
// the way, prefetching `next`) or from `wide`.
template <typename B, typename T>
void packed_block(int rows, const float* xb, const T* panel, int64_t k_len, const float* bias, float* out,
                  int64_t ldo, float* wide = nullptr, const char* next = nullptr) {
  static_assert(kWidenRows >= 2 * kMaxRows - 3, "even blocks of kWidenRows+ rows have 4+ rows");
  switch (rows) {
#define PAGODA_TILE(r) \
  case r:              \
    return tile<r, 1, B>(xb, 1, kMaxRows, panel, k_len, bias, out, ldo, wide, next);
    PAGODA_TILE(4) PAGODA_TILE(5) PAGODA_TILE(6)
#undef PAGODA_TILE
    default:
      TORCH_CHECK(false, "packed_block: ", rows, " rows");
  }
}

// Output unit u: panel u, or with `silu` panels u (gate) and u + units (up),
// whose row blocks' tiles go to a scratch tile [rows, gate 16 | up 16] and
// silu(gate) * up to out's 16 columns of unit u.
template <bool kBf16>
void half_linear(const float* x, int64_t rows, int64_t k_len, const uint16_t* packed, int64_t panels,
                 const float* bias, float* out, bool silu) {
  const int64_t units = silu ? panels / 2 : panels, n_out = units * kPanel, halves = silu ? 2 : 1;
  auto panel_of = [&](int64_t p) { return packed + p * k_len * kPanel; };
  auto bias_of = [&](int64_t p) { return bias ? bias + p * kPanel : nullptr; };
  if (rows < kWidenRows) {
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      float scratch[kWidenRows * 2 * kPanel];
      for (int64_t u = begin; u < end; ++u) {
        if (!silu) {
          few_rows<kBf16>(x, rows, panel_of(u), k_len, bias_of(u), out + u * kPanel, n_out);
          continue;
        }
        for (int64_t h = 0; h < 2; ++h)
          few_rows<kBf16>(x, rows, panel_of(u + h * units), k_len, bias_of(u + h * units), scratch + h * kPanel,
                          2 * kPanel);
        silu_rows(scratch, rows, out + u * kPanel, n_out);
      }
    });
    return;
  }
  // kBlockRows rows (in whole row blocks) at a time against every panel: their
  // packed copy stays in L2 across the panels. All rows per panel re-streamed x
  // from L3 or DRAM for each panel (a 1024-row prefill ran at half oneDNN's speed
  // in the engine).
  const std::vector<RowBlock> blocks = even_blocks(rows);
  const int64_t num_blocks = static_cast<int64_t>(blocks.size()), per_pass = kBlockRows / kMaxRows;
  // Units [begin, end) against a pass's `count` packed row blocks xb.
  auto run_panels = [&](const RowBlock* pass, int64_t count, const float* xb, int64_t begin, int64_t end) {
    static thread_local std::vector<float> wide;  // [halves, K, 16]
    wide.resize(halves * k_len * kPanel);
    alignas(32) float scratch[kMaxRows * 2 * kPanel];
    for (int64_t u = begin; u < end; ++u) {
      for (int64_t i = 0; i < count; ++i) {
        const float* xi = xb + i * kMaxRows * k_len;
        float* o = out + pass[i].first * n_out + u * kPanel;
        for (int64_t h = 0; h < halves; ++h) {
          const int64_t p = u + h * units;
          const uint16_t* panel = panel_of(p);
          float* w = wide.data() + h * k_len * kPanel;
          float* dst = silu ? scratch + h * kPanel : o;
          const int64_t ldo = silu ? 2 * kPanel : n_out;
          // The first row block widens the panel as it goes and leaves it in
          // `wide` for the others, and prefetches the next unit's panel (p + 1,
          // for gate and up alike) meanwhile: in a decode step the weights come
          // from DRAM, and without the prefetch each panel's read stalled before
          // its row blocks ran (cold, 2 threads: 0.82-0.94x the time at 16-128
          // rows, bench/avx2_small_m_ab.py). A prefetch past the last panel
          // cannot fault.
          if (i == 0)
            packed_block<HalfBits<kBf16>>(pass[i].rows, xi, panel, k_len, bias_of(p), dst, ldo, w,
                                          reinterpret_cast<const char*>(panel_of(p + 1)));
          else
            packed_block<float>(pass[i].rows, xi, w, k_len, bias_of(p), dst, ldo);
        }
        if (silu) silu_rows(scratch, pass[i].rows, o, n_out);
      }
    }
  };
  const int64_t threads = at::get_num_threads();
  const int64_t passes = (num_blocks + per_pass - 1) / per_pass;
  if (passes >= kPassesPerThread * threads) {
    // Prefill sizes: each thread takes whole passes (its rows against every
    // panel) from an atomic counter, packing its own rows: one parallel region
    // a call, where splitting each pass's panels between the threads took two
    // (the packing's and the panels') and a barrier after each, 86 a 4096-row
    // linear, and a thread the host descheduled held the other up at every one.
    // The passes are evened out over the blocks (43 of 16 blocks at 4096 rows
    // -> 44 of 15-16), a multiple of the threads so they end together.
    const int64_t count = (passes + threads - 1) / threads * threads;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      static thread_local std::vector<float> xp;  // reused: no page faults per call
      for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
        const int64_t b0 = num_blocks * t / count, b1 = num_blocks * (t + 1) / count;
        xp.resize((b1 - b0) * kMaxRows * k_len);
        for (int64_t b = b0; b < b1; ++b) pack_block(x, blocks[b], k_len, xp.data() + (b - b0) * kMaxRows * k_len);
        run_panels(blocks.data() + b0, b1 - b0, xp.data(), 0, units);
      }
    });
    return;
  }
  static thread_local std::vector<float> xp;  // reused: no page faults per call
  for (int64_t b0 = 0; b0 < num_blocks; b0 += per_pass) {
    const int64_t count = std::min(per_pass, num_blocks - b0);
    const RowBlock* pass = blocks.data() + b0;
    xp.resize(count * kMaxRows * k_len);
    // A pointer, not xp: inside the lambda `xp` names each worker thread's own copy.
    const float* xb = xp.data();
    pack_rows(x, pass, count, k_len, xp.data());
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) { run_panels(pass, count, xb, begin, end); });
  }
}
#endif

}  // namespace

bool half_f32_supported() {
#ifdef PAGODA_HALF_F32
  return true;
#else
  return false;
#endif
}

// [N, K] bf16 or fp16 -> [N / 16, K, 16] of the same dtype, each k step's 16
// columns in half_panel.h's order (bf16: 0, 8, 1, 9, ..., 7, 15; fp16: 0-15).
torch::Tensor pack_half_panels(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "pack_half_panels: weight must be [N, K]");
  const bool bf16 = weight.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf16 || weight.scalar_type() == torch::kHalf, "pack_half_panels: weight must be bf16 or fp16");
  TORCH_CHECK(weight.size(0) % kPanel == 0, "pack_half_panels: N must be a multiple of ", kPanel);
  const int64_t n = weight.size(0), k = weight.size(1);
  const auto panels = weight.view({n / kPanel, kPanel, k}).transpose(1, 2);  // [N / 16, K, 16]
  if (!bf16) return panels.contiguous();
  // [.., 2, 8] (half h, column i) -> [.., 8, 2]: position 2i + h holds column 8h + i.
  return panels.reshape({n / kPanel, k, 2, kPanel / 2}).transpose(2, 3).reshape({n / kPanel, k, kPanel}).contiguous();
}

// x [M, K] float32 @ packed^T (+ bias float32 [N]) -> [M, N] float32, or with
// silu (packed = [gate; up], each N / 2 a whole number of panels) [M, N / 2].
torch::Tensor half_linear_op(const torch::Tensor& x, const torch::Tensor& packed,
                             const std::optional<torch::Tensor>& bias, bool silu) {
  TORCH_CHECK(half_f32_supported(), "half_panel_linear: this build has no AVX2+FMA+F16C");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 2 && x.is_contiguous(),
              "half_panel_linear: x must be a contiguous float32 [M, K]");
  const bool bf16 = packed.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16 || packed.scalar_type() == torch::kHalf) && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == kPanel && packed.size(1) == x.size(1),
              "half_panel_linear: packed must be pack_half_panels' [N / 16, K, 16] with K = x's");
  const int64_t rows = x.size(0), k = x.size(1), panels = packed.size(0);
  TORCH_CHECK(!silu || panels % 2 == 0,
              "half_panel_linear_silu: gate and up must be whole panels (N % 32 == 0)");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat && bias->is_contiguous() && bias->numel() == panels * kPanel,
                "half_panel_linear: bias must be a contiguous float32 [N]");
    b = bias->data_ptr<float>();
  }
  auto out = torch::empty({rows, (silu ? panels / 2 : panels) * kPanel}, x.options());
#ifdef PAGODA_HALF_F32
  if (rows > 0) {
    const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr());
    if (bf16)
      half_linear<true>(x.data_ptr<float>(), rows, k, w, panels, b, out.data_ptr<float>(), silu);
    else
      half_linear<false>(x.data_ptr<float>(), rows, k, w, panels, b, out.data_ptr<float>(), silu);
  }
#endif
  return out;
}

torch::Tensor half_panel_linear(const torch::Tensor& x, const torch::Tensor& packed,
                                const std::optional<torch::Tensor>& bias) {
  return half_linear_op(x, packed, bias, false);
}

torch::Tensor half_panel_linear_silu(const torch::Tensor& x, const torch::Tensor& packed,
                                     const std::optional<torch::Tensor>& bias) {
  return half_linear_op(x, packed, bias, true);
}

// Kernels run without the GIL (no Python object in their bodies), as in module.cpp;
// the capability query keeps it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("half_f32_supported", &half_f32_supported, "Whether this build has the AVX2 half-storage linear");
  m.def("pack_half_panels", &pack_half_panels, "[N, K] bf16/fp16 weight -> [N / 16, K, 16] panels",
        py::call_guard<py::gil_scoped_release>());
  m.def("half_panel_linear", &half_panel_linear, "x [M, K] f32 @ widened packed^T (+ bias) -> [M, N] f32",
        py::arg("x"), py::arg("packed"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
  m.def("half_panel_linear_silu", &half_panel_linear_silu,
        "silu(x @ widened gate^T + b) * (x @ widened up^T + b) for packed = [gate; up] -> [M, N / 2] f32",
        py::arg("x"), py::arg("packed"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
  m.attr("half_panel_linear_fn") = linear_fn_capsule(&half_panel_linear);  // linear_fn.h
  m.attr("half_panel_linear_silu_fn") = linear_fn_capsule(&half_panel_linear_silu);
}
