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
#pragma once

#include <immintrin.h>

namespace {

inline bool stream_weights_nta() {
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
}

// One 64-byte line at p: non-temporal when nta, else into all levels.
inline void prefetch_weight_line(const void* p, bool nta) {
  if (nta)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA);
  else
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}

}  // namespace
