// The C++ entry points of the CPU kernels module, one declaration each: each
// .cpp defines its own, module.cpp binds them for Python and decode_stack.cpp
// calls them from its native decode loop.
//
// Kernel sources include <torch/types.h> (ATen and the torch:: names), not
// <torch/extension.h>: that one adds the whole C++ frontend and pybind11, ~34 s
// of parsing per file on a 2-core Xeon against ~10, and the files that bind for
// Python take <torch/python.h> instead (~19 s with types.h).
#pragma once

#include <torch/types.h>

#include <optional>
#include <tuple>
#include <vector>

bool supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);
void paged_attention_decode(const torch::Tensor& query, const torch::Tensor& key_cache,
                            const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                            const torch::Tensor& seq_lens, const torch::Tensor& query_rows,
                            torch::Tensor& out, double scale, int64_t sliding_window, int64_t prefix_len,
                            const std::optional<torch::Tensor>& prefix_out,
                            const std::optional<torch::Tensor>& prefix_lse);
std::vector<std::tuple<int64_t, int64_t, int64_t>> paged_attention_decode_parts(const torch::Tensor& seq_lens,
                                                                                int64_t threads,
                                                                                int64_t sliding_window);
void attention_over_prefix(const torch::Tensor& query, const torch::Tensor& key_cache,
                           const torch::Tensor& value_cache, const torch::Tensor& prefix_table,
                           int64_t prefix_len, const torch::Tensor& query_rows, torch::Tensor& out,
                           torch::Tensor& lse, double scale);
torch::Tensor row_argmax(const torch::Tensor& x);
bool bf16_gemm_supported();
torch::Tensor pack_bf16_panels(const torch::Tensor& weight);
torch::Tensor bf16_panel_linear_silu(const torch::Tensor& x, const torch::Tensor& packed,
                                     const std::optional<torch::Tensor>& bias);
torch::Tensor bf16_panel_linear(const torch::Tensor& x, const torch::Tensor& packed,
                                const std::optional<torch::Tensor>& bias);
bool prefill_supported(int64_t head_dim, bool bf16);
void paged_attention_prefill(const torch::Tensor& query, const torch::Tensor& key_cache,
                             const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                             const torch::Tensor& seq_lens, const torch::Tensor& query_ranges,
                             torch::Tensor& out, double scale, int64_t sliding_window);
void write_kv_cache(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& key_cache,
                    torch::Tensor& value_cache, const torch::Tensor& slot_mapping);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor add_rms_norm(const torch::Tensor& x, torch::Tensor& residual,
                           const torch::Tensor& weight, double eps);
torch::Tensor silu_and_mul(const torch::Tensor& x);
void rotary_embedding(torch::Tensor& query, torch::Tensor& key, const torch::Tensor& positions,
                      const torch::Tensor& cos_cache, const torch::Tensor& sin_cache,
                      int64_t head_dim);
void rope_write_kv(torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& cos_cache,
                   const torch::Tensor& sin_cache, torch::Tensor& key_cache, torch::Tensor& value_cache,
                   const torch::Tensor& slot_mapping, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim);
void bind_decode_stack(py::module_& m);
