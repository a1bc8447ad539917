// A linear kernel's C++ entry point, handed from its module to decode_stack.cpp
// as a named capsule: the GEMV kernels live in modules of their own (so a change
// to one rebuilds only it), and the native decode loop calls them without a
// Python call in between. Every linear kernel has this signature:
//   x [M, K], packed weight (the kernel's own layout), bias [N] or none -> [M, N].
#pragma once

#include <torch/types.h>

#include <optional>

using LinearFn = torch::Tensor (*)(const torch::Tensor& x, const torch::Tensor& packed,
                                   const std::optional<torch::Tensor>& bias);

inline constexpr const char* kLinearFnCapsule = "pagoda.LinearFn";

inline py::capsule linear_fn_capsule(LinearFn fn) {
  // Function to object pointer: well defined on the platforms that dlopen modules.
  return py::capsule(reinterpret_cast<void*>(fn), kLinearFnCapsule);
}

// The kernel in a capsule linear_fn_capsule made; throws (a TypeError in Python)
// for any other object.
inline LinearFn linear_fn_from(const py::object& capsule) {
  void* fn = PyCapsule_GetPointer(capsule.ptr(), kLinearFnCapsule);
  if (fn == nullptr) throw py::error_already_set();
  return reinterpret_cast<LinearFn>(fn);
}
