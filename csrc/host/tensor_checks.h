// Host-side argument checks shared by the CPU and CUDA operator wrappers
// (torch headers; not for device code).
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <utility>

namespace vmfdist {

// All tensor arguments of `op` on one device, e.g.
//   check_same_device("vmf_sample", {{"loc", loc}, {"concentration", kappa}});
// The error names the first argument found on another device than the first one.
// (The fake kernels in vmfdist/_ops make the same check, since a tensor on "meta"
// sends the call to them instead of to a CPU or CUDA kernel.)
inline void check_same_device(const char* op, std::initializer_list<std::pair<const char*, at::Tensor>> ts) {
  const auto& [n0, t0] = *ts.begin();
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(t.device() == t0.device(), op, ": ", name, " must be on the same device as ", n0, ", got ", name,
                " on ", t.device(), " and ", n0, " on ", t0.device());
  }
}

}  // namespace vmfdist
