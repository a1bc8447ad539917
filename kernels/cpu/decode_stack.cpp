// A decoder stack's decode-only step in one call from Python.
//
// worker/models/decode_plan.py binds each layer's kernels once and runs them in a
// Python loop: ~8 calls a layer, each through a closure, pybind11's argument
// conversion and a GIL release. At one row that loop costs about as much as the
// attention it drives (SmolLM2-135M, 30 layers: ~0.5 ms of a ~11 ms token on a
// Zen 4), and each gap is time the other OpenMP thread spins. Here the same
// kernels, with the same arguments in the same order, run from a C++ loop over
// layers bound once (DecodeStack), so the results are the plan's bit for bit
// (tests/worker/models/test_decode_stack.py); the plan stays the twin, and it
// still runs every step this does not take (prefill rows, a layer not yet bound
// to its cache: worker/models/decode_stack.py decides).
//
// Per layer, from the embedded rows hidden [T, H] (T decode rows, one per sequence):
//   h = rms_norm(hidden) (layer 0; residual = hidden) or add_rms_norm(h, residual)
//   qkv = qkv(h) [T, (nh + 2 nkv) d]; RoPE in place + K/V into the cache (rope_write_kv)
//   attn [T, nh, d] = paged_attention_decode(q view of qkv, the cache), where the
//     rows share a cached prefix (a cascade, prefix_len > 0) over the tokens past
//     it, merged with attention_over_prefix's output over the prefix
//   h = add_rms_norm(o(attn [T, nh d]), residual); h = down(silu(gate_up(h)))
// and last add_rms_norm(h, residual, final norm) -> [T, H], what the plan returns.
#include <torch/python.h>
#include <torch/types.h>

#include <optional>
#include <vector>

#include "kernel_api.h"
#include "linear_fn.h"

namespace {

// One linear: its kernel bound to its weight; `silu` runs silu_and_mul after it
// (the half-storage path's gate/up; the bf16 one has a fused-SiLU kernel).
struct BoundLinear {
  LinearFn fn = nullptr;
  torch::Tensor packed;
  std::optional<torch::Tensor> bias;
  bool silu = false;

  // spec: (capsule, packed weight, bias or None, silu after), as decode_stack.py makes it.
  static BoundLinear from(const py::tuple& spec) {
    TORCH_CHECK(spec.size() == 4, "DecodeStack: a linear is (kernel capsule, packed, bias, silu)");
    BoundLinear l;
    l.fn = linear_fn_from(spec[0]);
    l.packed = spec[1].cast<torch::Tensor>();
    if (!spec[2].is_none()) l.bias = spec[2].cast<torch::Tensor>();
    l.silu = spec[3].cast<bool>();
    return l;
  }

  torch::Tensor operator()(const torch::Tensor& x) const {
    torch::Tensor y = fn(x, packed, bias);
    return silu ? silu_and_mul(y) : y;
  }
};

struct StackLayer {
  torch::Tensor in_norm, post_norm;  // RMSNorm weights [H]
  double in_eps = 0, post_eps = 0;
  BoundLinear qkv, o, gate_up, down;
  torch::Tensor cos, sin;  // the rotary caches rope_write_kv reads
  torch::Tensor key_cache, value_cache;  // [num_blocks, block_size, nkv, d] views
  double scale = 1;
  int64_t window = 0;  // sliding window, 0: none
};

class DecodeStack {
 public:
  DecodeStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, torch::Tensor final_norm,
              double final_eps)
      : num_heads_(num_heads),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        final_norm_(std::move(final_norm)),
        final_eps_(final_eps) {}

  void add_layer(torch::Tensor in_norm, double in_eps, torch::Tensor post_norm, double post_eps,
                 const py::tuple& qkv, const py::tuple& o, const py::tuple& gate_up, const py::tuple& down,
                 torch::Tensor cos, torch::Tensor sin, torch::Tensor key_cache, torch::Tensor value_cache,
                 double scale, int64_t window) {
    StackLayer l;
    l.in_norm = std::move(in_norm), l.in_eps = in_eps;
    l.post_norm = std::move(post_norm), l.post_eps = post_eps;
    l.qkv = BoundLinear::from(qkv), l.o = BoundLinear::from(o);
    l.gate_up = BoundLinear::from(gate_up), l.down = BoundLinear::from(down);
    l.cos = std::move(cos), l.sin = std::move(sin);
    l.key_cache = std::move(key_cache), l.value_cache = std::move(value_cache);
    l.scale = scale, l.window = window;
    layers_.push_back(std::move(l));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // hidden: the embedded rows [T, H] (it becomes the residual and is updated in
  // place, as in the plan); the metadata tensors are the step's decode partition
  // (CPUAttentionMetadata): slot_mapping [T], block_tables [T, max_blocks] int32,
  // seq_lens [T] int32, query_rows [T] int64; a cascade: prefix_len > 0 tokens of
  // prefix_table (the blocks every row shares), as the backend's _decode takes it.
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& positions,
                        const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens, const torch::Tensor& query_rows, int64_t prefix_len,
                        const std::optional<torch::Tensor>& prefix_table) {
    TORCH_CHECK(!layers_.empty(), "DecodeStack: no layers");
    TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "DecodeStack: hidden must be contiguous [T, H]");
    const int64_t rows = hidden.size(0);
    // [T, nh, d], and its [T, nh d] view for o_proj: written whole by every layer's
    // attention before that layer's o_proj reads it.
    torch::Tensor attn = torch::empty({rows, num_heads_, head_dim_}, hidden.options());
    const torch::Tensor attn_rows = attn.view({rows, num_heads_ * head_dim_});
    // A cascade's prefix half, [nkv, T * group, d] and [nkv, T * group] float32:
    // written whole by each layer's attention_over_prefix before its decode reads it.
    std::optional<torch::Tensor> prefix_out, prefix_lse;
    if (prefix_len > 0) {
      TORCH_CHECK(prefix_table.has_value(), "DecodeStack: a cascade needs its prefix table");
      const int64_t rows_per_head = rows * (num_heads_ / num_kv_heads_);
      const auto f32 = hidden.options().dtype(torch::kFloat);
      prefix_out = torch::empty({num_kv_heads_, rows_per_head, head_dim_}, f32);
      prefix_lse = torch::empty({num_kv_heads_, rows_per_head}, f32);
    }
    torch::Tensor residual = hidden;
    torch::Tensor h;
    for (size_t i = 0; i < layers_.size(); ++i) {
      StackLayer& l = layers_[i];
      h = i == 0 ? rms_norm(hidden, l.in_norm, l.in_eps) : add_rms_norm(h, residual, l.in_norm, l.in_eps);
      torch::Tensor qkv = l.qkv(h);
      rope_write_kv(qkv, positions, l.cos, l.sin, l.key_cache, l.value_cache, slot_mapping, num_heads_,
                    num_kv_heads_, head_dim_);
      const torch::Tensor query = qkv.as_strided({rows, num_heads_, head_dim_}, {qkv.stride(0), head_dim_, 1});
      if (prefix_len > 0)
        attention_over_prefix(query, l.key_cache, l.value_cache, *prefix_table, prefix_len, query_rows, *prefix_out,
                              *prefix_lse, l.scale);
      paged_attention_decode(query, l.key_cache, l.value_cache, block_tables, seq_lens, query_rows, attn, l.scale,
                             l.window, prefix_len, prefix_out, prefix_lse);
      h = add_rms_norm(l.o(attn_rows), residual, l.post_norm, l.post_eps);
      h = l.down(l.gate_up(h));
    }
    return add_rms_norm(h, residual, final_norm_, final_eps_);
  }

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  torch::Tensor final_norm_;
  double final_eps_;
  std::vector<StackLayer> layers_;
};

}  // namespace

void bind_decode_stack(py::module_& m) {
  py::class_<DecodeStack>(m, "DecodeStack", "A decoder stack's decode-only step in one call (decode_stack.cpp)")
      .def(py::init<int64_t, int64_t, int64_t, torch::Tensor, double>(), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("final_norm"), py::arg("final_eps"))
      .def("add_layer", &DecodeStack::add_layer)
      .def_property_readonly("num_layers", &DecodeStack::num_layers)
      // The whole loop without the GIL: no Python object is touched inside it.
      .def("forward", &DecodeStack::forward, py::arg("hidden"), py::arg("positions"), py::arg("slot_mapping"),
           py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_rows"), py::arg("prefix_len") = 0,
           py::arg("prefix_table") = py::none(), py::call_guard<py::gil_scoped_release>());
}
