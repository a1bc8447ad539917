// Weight-only linears y = (x W_q^T) * scale + b on CPUs with AVX512-BF16, for
// 8-bit weights with one scale per output row: int8 (symmetric) and FP8 e4m3.
//
// A decode step streams every weight from DRAM; bytes are the cost. The codes
// sit in the bf16 panel kernel's layout (gemm_bf16.cpp) at one byte each, and
// each k pair of a panel becomes two bf16 vectors in registers, shared by all
// rows of the block, before the same vdpbf16ps loop. Codes are exact in bf16
// (int8: integers up to 127; e4m3: 3 mantissa bits, subnormals included, by a
// 128-entry table), so the only rounding beyond the twin's is the scale being
// applied to the sum instead of to each weight. It is its own extension
// (kernels/cpu/__init__.py: load_weight_only_kernels), built apart from the
// attention kernels.
//
// 4-bit codes with a scale and zero per (group of K, column) take the same
// loop with the nibbles decoded to bf16 (code - 8) by a 16-entry table: a block
// sums each group apart in registers and adds scale * (sum - (zero - 8) * the
// group's sum of x) to its float32 rows, which stay in L1. That is exact
// arithmetic on the codes where the twin rounds each weight to bf16 first.
//
// Shapes:
//   weight:  [N, K] int8 or uint8 (fp8 bits), N a multiple of 32, K even
//   packed:  [N / 32, K / 2, 64] uint8: panel p, k pair kp holds columns
//            p * 32 .. p * 32 + 31, each as (W[n][2 kp], W[n][2 kp + 1])
//   x:       [M, K] bf16, contiguous; scales: [N] float32; bias: [N] or none
//   out:     [M, N] bf16
//   int4:    codes [N, K] in [0, 16) -> packed [N / 32, K / 2, 32] uint8, byte c of
//            k pair kp = code[n][2 kp] | code[n][2 kp + 1] << 4; scales, offsets:
//            [K / group, N] float32, offsets = scale * (zero - 8)
// The plain twin dequantizes to bf16 and calls F.linear
// (worker/layers/quantization/int_weight.py, fp8_weight.py).
#include <torch/python.h>
#include <torch/types.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>
#include <optional>

#include "stream_prefetch.h"

namespace {

constexpr int kPanel = 32;
constexpr int kMaxRows = 12;

bool supported() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

#ifdef __AVX512BF16__
// The panel 1 KB ahead. Read once (every row in one block: decode), streamed as
// gemv_bf16.cpp streams its weights (stream_prefetch.h: non-temporal on AMD,
// where keeping the step's weights out of L2/L3 measured int8 0.91x and fp8
// 0.96x the step time on a Zen 5; T0 on Intel). Read again by the next row
// block (more than kMaxRows rows): into the caches.
inline void prefetch_ahead(const uint8_t* p, bool once) {
  prefetch_weight_line(p + 1024, once && stream_weights_nta());
}

// bf16 bits of e4m3 magnitudes 0..127 (bit 7, the sign, is added apart).
struct Fp8Table {
  __m512i t[4];
  Fp8Table() {
    alignas(64) uint16_t v[128];
    for (int m = 0; m < 128; ++m) {
      const int e = m >> 3, f = m & 7;
      float x = e == 0 ? f / 512.0f : (1.0f + f / 8.0f) * static_cast<float>(1 << e) / 128.0f;
      if (m == 127) x = __builtin_nanf("");  // e4m3fn's one NaN
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      v[m] = static_cast<uint16_t>(bits >> 16);  // exact: 4 significant bits
    }
    for (int i = 0; i < 4; ++i) t[i] = _mm512_load_si512(v + 32 * i);
  }
};

// 32 codes (16 columns x a k pair, in pair order) -> their bf16 values.
template <bool kFp8>
inline __m512bh decode(const uint8_t* codes, const Fp8Table& table) {
  if constexpr (kFp8) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
    const __m512i low = _mm512_permutex2var_epi16(table.t[0], v, table.t[1]);  // index bits 0-5
    const __m512i high = _mm512_permutex2var_epi16(table.t[2], v, table.t[3]);
    const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(v, _mm512_set1_epi16(0x40)), low, high);
    // mag | ((v << 8) & 0x8000): the sign bit.
    return (__m512bh)_mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(v, 8), _mm512_set1_epi16(-32768), 0xF8);
  } else {
    const __m128i* c = reinterpret_cast<const __m128i*>(codes);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c + 1)));
    return _mm512_cvtne2ps_pbh(b, a);  // a: columns 0-7, b: 8-15, each a k pair
  }
}

template <bool kFp8, int kRows>
void panel_block(const uint16_t* x, int64_t k, const uint8_t* panel, const float* scale, const float* bias,
                 uint16_t* out, int64_t ldo, const Fp8Table& table, bool once) {
  __m512 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < k / 2; ++kp) {
    const uint8_t* p = panel + kp * 2 * kPanel;
    prefetch_ahead(p, once);
    const __m512bh w0 = decode<kFp8>(p, table);
    const __m512bh w1 = decode<kFp8>(p + kPanel, table);
    for (int r = 0; r < kRows; ++r) {
      uint32_t pair;
      std::memcpy(&pair, x + r * k + 2 * kp, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
    }
  }
  const __m512 s0 = _mm512_loadu_ps(scale), s1 = _mm512_loadu_ps(scale + 16);
  const __m512 b0 = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias != nullptr ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < kRows; ++r) {
    const __m512 v0 = _mm512_fmadd_ps(acc[r][0], s0, b0), v1 = _mm512_fmadd_ps(acc[r][1], s1, b1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), (__m256i)_mm512_cvtneps_pbh(v0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + 16), (__m256i)_mm512_cvtneps_pbh(v1));
  }
}

template <bool kFp8>
void run_block(int rows, const uint16_t* x, int64_t k, const uint8_t* panel, const float* scale,
               const float* bias, uint16_t* out, int64_t ldo, const Fp8Table& table, bool once) {
  switch (rows) {
#define PAGODA_ROWS(r) \
  case r:              \
    return panel_block<kFp8, r>(x, k, panel, scale, bias, out, ldo, table, once);
    PAGODA_ROWS(1) PAGODA_ROWS(2) PAGODA_ROWS(3) PAGODA_ROWS(4) PAGODA_ROWS(5) PAGODA_ROWS(6)
    PAGODA_ROWS(7) PAGODA_ROWS(8) PAGODA_ROWS(9) PAGODA_ROWS(10) PAGODA_ROWS(11) PAGODA_ROWS(12)
#undef PAGODA_ROWS
    default:
      TORCH_CHECK(false, "run_block: ", rows, " rows");
  }
}
// 16 columns x a k pair of nibbles (16 bytes) -> bf16 (code - 8) pairs.
inline __m512bh decode_nibbles(const uint8_t* codes, __m512i table) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  // Each 32-bit lane: low nibble into bits 0-3 (k even), high into 16-19 (k odd).
  const __m512i v = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
  return (__m512bh)_mm512_permutexvar_epi16(v, table);
}

template <int kRows>
void int4_block(const uint16_t* x, int64_t k, const uint8_t* panel, const float* scales, const float* offsets,
                int64_t n, int64_t group, const float* xsum, int64_t groups, const float* bias, uint16_t* out,
                int64_t ldo, __m512i table, bool once) {
  alignas(64) float rows[kRows][kPanel];  // x W^T + bias so far, per row
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kPanel; ++c) rows[r][c] = bias != nullptr ? bias[c] : 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kp = g * group / 2; kp < (g + 1) * group / 2; ++kp) {
      const uint8_t* p = panel + kp * kPanel;
      prefetch_ahead(p, once);
      const __m512bh w0 = decode_nibbles(p, table), w1 = decode_nibbles(p + 16, table);
      for (int r = 0; r < kRows; ++r) {
        uint32_t pair;
        std::memcpy(&pair, x + r * k + 2 * kp, 4);
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
      }
    }
    const float* s = scales + g * n;
    const float* o = offsets + g * n;
    const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16);
    const __m512 o0 = _mm512_loadu_ps(o), o1 = _mm512_loadu_ps(o + 16);
    for (int r = 0; r < kRows; ++r) {
      const __m512 xs = _mm512_set1_ps(xsum[r * groups + g]);
      // rows += scale * sum - scale * (zero - 8) * sum(x over the group)
      __m512 v0 = _mm512_fmadd_ps(s0, acc[r][0], _mm512_load_ps(rows[r]));
      __m512 v1 = _mm512_fmadd_ps(s1, acc[r][1], _mm512_load_ps(rows[r] + 16));
      _mm512_store_ps(rows[r], _mm512_fnmadd_ps(o0, xs, v0));
      _mm512_store_ps(rows[r] + 16, _mm512_fnmadd_ps(o1, xs, v1));
    }
  }
  for (int r = 0; r < kRows; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(rows[r])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + 16),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(rows[r] + 16)));
  }
}

void run_int4_block(int rows, const uint16_t* x, int64_t k, const uint8_t* panel, const float* scales,
                    const float* offsets, int64_t n, int64_t group, const float* xsum, int64_t groups,
                    const float* bias, uint16_t* out, int64_t ldo, __m512i table, bool once) {
  switch (rows) {
#define PAGODA_ROWS(r) \
  case r:              \
    return int4_block<r>(x, k, panel, scales, offsets, n, group, xsum, groups, bias, out, ldo, table, once);
    PAGODA_ROWS(1) PAGODA_ROWS(2) PAGODA_ROWS(3) PAGODA_ROWS(4) PAGODA_ROWS(5) PAGODA_ROWS(6)
    PAGODA_ROWS(7) PAGODA_ROWS(8) PAGODA_ROWS(9) PAGODA_ROWS(10) PAGODA_ROWS(11) PAGODA_ROWS(12)
#undef PAGODA_ROWS
    default:
      TORCH_CHECK(false, "run_int4_block: ", rows, " rows");
  }
}
#endif

torch::Tensor pack_int4_panels(const torch::Tensor& codes) {
  TORCH_CHECK(codes.dim() == 2 && codes.element_size() == 1, "pack_int4_panels takes [N, K] uint8 codes");
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kPanel == 0 && k % 2 == 0, "pack_int4_panels: [", n, ", ", k, "] needs N % 32 == 0 and even K");
  const torch::Tensor w = codes.contiguous();
  auto packed = torch::empty({n / kPanel, k / 2, kPanel}, codes.options().dtype(torch::kUInt8));
  const auto* src = reinterpret_cast<const uint8_t*>(w.data_ptr());
  auto* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t kp = 0; kp < k / 2; ++kp)
        for (int c = 0; c < kPanel; ++c) {
          const uint8_t* s = src + (p * kPanel + c) * k + 2 * kp;
          dst[(p * (k / 2) + kp) * kPanel + c] = static_cast<uint8_t>((s[0] & 15) | (s[1] << 4));
        }
  });
  return packed;
}

torch::Tensor int4_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scales,
                          const torch::Tensor& offsets, int64_t group, const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(supported(), "int4_linear needs a build with AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be contiguous bf16 [rows, in]");
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.dim() == 3 && packed.size(2) == kPanel &&
                  packed.is_contiguous(),
              "packed must come from pack_int4_panels");
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0), n = panels * kPanel;
  TORCH_CHECK(packed.size(1) * 2 == k, "x has ", k, " columns, the weight ", packed.size(1) * 2);
  TORCH_CHECK(group > 0 && group % 2 == 0 && k % group == 0, "group size ", group, " must be even and divide ", k);
  const int64_t groups = k / group;
  for (const auto* t : {&scales, &offsets})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->dim() == 2 && t->size(0) == groups && t->size(1) == n &&
                    t->is_contiguous(),
                "scales and offsets must be contiguous float32 [", groups, ", ", n, "]");
  torch::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have ", n, " values");
    bias_f32 = bias->to(torch::kFloat).contiguous();
  }
  // Each row's sum over each group: [M, groups], for the zero points.
  const torch::Tensor xsum = x.to(torch::kFloat).view({m, groups, group}).sum(-1).contiguous();
  auto out = torch::empty({m, n}, x.options());
#ifdef __AVX512BF16__
  alignas(64) uint16_t values[32] = {};
  for (int q = 0; q < 16; ++q) {
    const float v = static_cast<float>(q - 8);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    values[q] = static_cast<uint16_t>(bits >> 16);
  }
  const __m512i table = _mm512_load_si512(values);
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = packed.data_ptr<uint8_t>();
  const float* bp = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t r = 0; r < m;) {
        const int64_t left = m - r, blocks = (left + kMaxRows - 1) / kMaxRows;
        const int rows = static_cast<int>((left + blocks - 1) / blocks);
        run_int4_block(rows, xp + r * k, k, wp + p * (k / 2) * kPanel, scales.data_ptr<float>() + p * kPanel,
                       offsets.data_ptr<float>() + p * kPanel, n, group, xsum.data_ptr<float>() + r * groups,
                       groups, bp != nullptr ? bp + p * kPanel : nullptr, op + r * n + p * kPanel, n, table,
                       m <= kMaxRows);
        r += rows;
      }
  });
#else
  (void)group;
#endif
  return out;
}

torch::Tensor pack_byte_panels(const torch::Tensor& weight) {
  TORCH_CHECK(weight.element_size() == 1 && weight.dim() == 2, "pack_byte_panels takes a 2-D one-byte weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kPanel == 0 && k % 2 == 0, "pack_byte_panels: [", n, ", ", k, "] needs N % 32 == 0 and even K");
  const torch::Tensor w = weight.contiguous();
  auto packed = torch::empty({n / kPanel, k / 2, 2 * kPanel}, weight.options().dtype(torch::kUInt8));
  const auto* src = reinterpret_cast<const uint8_t*>(w.data_ptr());
  auto* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t kp = 0; kp < k / 2; ++kp)
        for (int c = 0; c < kPanel; ++c) {
          uint8_t* d = dst + ((p * (k / 2) + kp) * kPanel + c) * 2;
          const uint8_t* s = src + (p * kPanel + c) * k + 2 * kp;
          d[0] = s[0];
          d[1] = s[1];
        }
  });
  return packed;
}

torch::Tensor weight_only_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scales,
                                 const std::optional<torch::Tensor>& bias, bool fp8) {
  TORCH_CHECK(supported(), "weight_only_linear needs a build with AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be contiguous bf16 [rows, in]");
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.dim() == 3 && packed.size(2) == 2 * kPanel &&
                  packed.is_contiguous(),
              "packed must come from pack_byte_panels");
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0), n = panels * kPanel;
  TORCH_CHECK(packed.size(1) * 2 == k, "x has ", k, " columns, the weight ", packed.size(1) * 2);
  TORCH_CHECK(scales.scalar_type() == torch::kFloat && scales.numel() == n && scales.is_contiguous(),
              "scales must be ", n, " contiguous float32 values");
  torch::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have ", n, " values");
    bias_f32 = bias->to(torch::kFloat).contiguous();
  }
  auto out = torch::empty({m, n}, x.options());
#ifdef __AVX512BF16__
  static const Fp8Table table;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = packed.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* bp = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t r = 0; r < m;) {
        // Even blocks of at most 12 rows, as the bf16 panel kernel runs them.
        const int64_t left = m - r, blocks = (left + kMaxRows - 1) / kMaxRows;
        const int rows = static_cast<int>((left + blocks - 1) / blocks);
        const uint8_t* panel = wp + p * (k / 2) * 2 * kPanel;
        const float* b = bp != nullptr ? bp + p * kPanel : nullptr;
        uint16_t* o = op + r * n + p * kPanel;
        if (fp8)
          run_block<true>(rows, xp + r * k, k, panel, sp + p * kPanel, b, o, n, table, m <= kMaxRows);
        else
          run_block<false>(rows, xp + r * k, k, panel, sp + p * kPanel, b, o, n, table, m <= kMaxRows);
        r += rows;
      }
  });
#else
  (void)fp8;
#endif
  return out;
}

}  // namespace

// Kernels run without the GIL (no Python object in their bodies), as in module.cpp;
// the capability query keeps it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supported", &supported, "Whether this build has the AVX512-BF16 weight-only linears");
  m.def("pack_byte_panels", &pack_byte_panels, "[N, K] int8/fp8 weight -> [N / 32, K / 2, 64] uint8 panels",
        py::call_guard<py::gil_scoped_release>());
  m.def("weight_only_linear", &weight_only_linear,
        "x [M, K] bf16 @ (packed codes)^T * scales (+ bias) -> [M, N] bf16; fp8: e4m3 codes, else int8",
        py::arg("x"), py::arg("packed"), py::arg("scales"), py::arg("bias") = py::none(), py::arg("fp8") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("pack_int4_panels", &pack_int4_panels, "[N, K] 4-bit codes -> [N / 32, K / 2, 32] uint8 panels",
        py::call_guard<py::gil_scoped_release>());
  m.def("int4_linear", &int4_linear,
        "x [M, K] bf16 @ dequantized(packed, scales, offsets, group)^T (+ bias) -> [M, N] bf16", py::arg("x"),
        py::arg("packed"), py::arg("scales"), py::arg("offsets"), py::arg("group"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
}
