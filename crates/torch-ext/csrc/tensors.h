// kiln native extension: helpers for tensor handles passed across the C ABI.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <vector>

namespace kiln {

// Copies `n` borrowed tensor handles into a list (the handles share storage, nothing is copied).
inline std::vector<at::Tensor> tensor_list(const at::Tensor* const* ptrs, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(*ptrs[i]);
  }
  return out;
}

}  // namespace kiln
