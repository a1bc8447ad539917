// Software prefetch of weight lines a decode step reads once (the small-batch
// linears: gemv_bf16.cpp, gemv_f32.cpp, gemm_weight_only.cpp), with the hint
// chosen by CPU vendor at run time.
//
// AMD (Zen 4, Zen 5): non-temporal. A one-row step streams every weight (269 MB
// for SmolLM2-135M) through the caches; prefetched NTA those lines stay out of
// L2/L3 and no longer evict what the kernels between the linears use (the KV
// rows, the interpreter, the activations): one stream on a Zen 5, 2 threads,
// 0.951x the step time (gemv_bf16), 0.924x (gemv_f32, emulated AVX2), int8
// 0.91x and fp8 0.96x (gemm_weight_only).
// Intel (an AMX Xeon, Granite Rapids-class, family 6 model 167): T0. There
// prefetchnta fills L1 only, outside the L2 streamer, so a core's stream is
// capped by L1's outstanding misses. 2 threads, SmolLM2's 30 layers + LM head
// at one row, T0 / NTA: gemv_bf16 7.9 / 23.2 ms a pass (bench/gemv_ab.py; a
// plain read of the bytes 43 GB/s, NTA 13), gemv_f32 under emulated AVX2 12.8 /
// 18.5-20.1 (no prefetch: 13.7-14.2), int8 weight-only 7.9-8.2 / 9.6-9.7, fp8
// 8.4-8.7 / 9.8-9.9, int4 6.4-6.9 / 7.6-7.8 (bench/quant_linear_ab.py); one
// stream served at 28.7 ms a token with NTA (11.2 before it).
// Zen 4 (AMD family 25 with AVX-512): prefetcht2 (into L2) where the others
// take NTA. Measured on a Zen 4 "Genoa" VM, 2 threads, against NTA:
// bench/gemv_ab.py --rows 1 2 --old (all linears and the LM head, weights cold)
// median 0.915-0.945x a pass at one row, 0.915-0.97x at two (three runs); one
// stream's decode (bench/single_stream_ab.py, native, 256 tokens, builds
// alternated, a noisy host) 26 pairs new/old median 0.947 (0.65-1.27), at 1
// thread 0.94. A plain read of scattered 3 KB blocks there: prefetcht2 30-36
// GB/s, NTA 20.
// Zen 3 (no AVX-512) keeps NTA: a real one (family 25 model 1, 2 vCPUs),
// gemv_f32.cpp's one- and two-row passes with prefetcht2 instead
// (bench/avx2_small_m_ab.py, 9 pairs): per-pair medians 1.031 and 0.989, no
// difference. Zen 5 (family 26) keeps NTA, unmeasured against prefetcht2.
#pragma once

#include <cpuid.h>
#include <immintrin.h>

namespace {

inline bool is_zen4() {
  __builtin_cpu_init();  // may run before libgcc's own constructor: kWeightsIntoL2 is set at load
  unsigned eax, ebx, ecx, edx;
  if (!__builtin_cpu_is("amd") || !__builtin_cpu_supports("avx512f") || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
    return false;
  const unsigned base = (eax >> 8) & 0xf, family = base == 0xf ? base + ((eax >> 20) & 0xff) : base;
  return family == 25;
}

// Read once, when the module loads: prefetch_weight_line tests it per line, where
// a function-local static would add its guard check to every prefetch.
const bool kWeightsIntoL2 = is_zen4();

inline bool stream_weights_nta() {
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
}

// One 64-byte line at p: when nta (AMD), non-temporal, or into L2 on a Zen 4;
// else into all levels.
inline void prefetch_weight_line(const void* p, bool nta) {
  if (!nta)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  else if (kWeightsIntoL2)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T2);
  else
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA);
}

}  // namespace
