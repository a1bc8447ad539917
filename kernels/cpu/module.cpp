// The one Python module of the CPU kernels: each .cpp defines its functions
// (declared in kernel_api.h), this file binds them.
#include <torch/python.h>
#include <torch/types.h>

#include <optional>
#include <tuple>
#include <vector>

#include "kernel_api.h"
#include "linear_fn.h"

// NOTE: every kernel runs without the GIL (its body touches no Python object;
// arguments are converted before the guard and the result after it), so the
// worker's event loop and gRPC threads run Python while a step's kernels run.
// The capability queries keep it: they return in nanoseconds, and a release
// would only let another thread take the GIL that the caller then waits for.
using release_gil = py::call_guard<py::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention_decode", &paged_attention_decode, "Paged attention, one query per sequence",
        py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("seq_lens"), py::arg("query_rows"), py::arg("out"), py::arg("scale"),
        py::arg("sliding_window"), py::arg("prefix_len") = 0, py::arg("prefix_out") = py::none(),
        py::arg("prefix_lse") = py::none(), release_gil());
  m.def("attention_over_prefix", &attention_over_prefix,
        "Cascade: every decode query against the prefix all its sequences share", release_gil());
  m.def("paged_attention_decode_parts", &paged_attention_decode_parts,
        "How the decode kernel splits sequences over `threads` threads: (seq, first, end) per part, "
        "empty when it does not");
  m.def("supports", &supports, "Whether the decode kernel handles these head shapes");
  m.def("paged_attention_prefill", &paged_attention_prefill,
        "Paged attention over many new rows per sequence (bf16 or float32 tiles)", release_gil());
  m.def("prefill_supported", &prefill_supported,
        "Whether this build and CPU run the prefill and cascade kernels in bf16 (or float32)",
        py::arg("head_dim"), py::arg("bf16") = true);
  m.def("bf16_gemm_supported", &bf16_gemm_supported, "Whether this build has the AVX512-BF16 linear");
  m.def("pack_bf16_panels", &pack_bf16_panels, "[N, K] bf16 weight -> [N / 32, K / 2, 64] panels", release_gil());
  m.def("bf16_panel_linear", &bf16_panel_linear, "x [M, K] @ packed^T (+ bias) -> [M, N] bf16",
        py::arg("x"), py::arg("packed"), py::arg("bias") = py::none(), release_gil());
  m.def("bf16_panel_linear_silu", &bf16_panel_linear_silu,
        "silu(x @ gate^T + b) * (x @ up^T + b) for packed [gate; up] -> [M, N / 2] bf16", py::arg("x"),
        py::arg("packed"), py::arg("bias") = py::none(), release_gil());
  m.def("row_argmax", &row_argmax, "Index of each float32 row's first maximum (NaN: the first NaN)", release_gil());
  m.def("write_kv_cache", &write_kv_cache, "Copy new K/V rows into their cache slots", release_gil());
  m.def("rms_norm", &rms_norm, "RMSNorm of bf16 or float32 rows", release_gil());
  m.def("add_rms_norm", &add_rms_norm, "residual += x (in place), then RMSNorm of it", release_gil());
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up over [tokens, 2 * d] bf16 or float32", release_gil());
  m.def("rotary_embedding", &rotary_embedding, "NeoX-style RoPE in place on bf16 or float32 q and k", release_gil());
  m.def("rope_write_kv", &rope_write_kv,
        "RoPE in place on fused QKV rows, then their K and V into the cache slots", release_gil());
  // The panel linears' C++ entry points, and the native decode loop that calls them
  // and the GEMV modules' (decode_stack.cpp).
  m.attr("bf16_panel_linear_fn") = linear_fn_capsule(&bf16_panel_linear);
  m.attr("bf16_panel_linear_silu_fn") = linear_fn_capsule(&bf16_panel_linear_silu);
  bind_decode_stack(m);
}
