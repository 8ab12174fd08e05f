// Host-side argument checks shared by the CPU and CUDA von Mises-Fisher kernels
// (torch headers; not for device code).  The Python layer (vmfdist/distributions)
// validates user input with friendlier messages; these guard the raw ops.
#pragma once

#include <ATen/ATen.h>

#include "vmfdist/philox.h"
#include "host/tensor_checks.h"

namespace vmfdist {

// vmf_sample(loc (B, d), concentration (B,), num_samples, ...).
// The seed and offset are checked by check_random_args (random_state.h).
inline void check_vmf_sample_args(const at::Tensor& loc, const at::Tensor& kappa, int64_t num_samples) {
  constexpr const char* op = "vmf_sample";
  TORCH_CHECK(loc.dim() == 2, op, ": loc must have shape (batch, d), got ", loc.sizes());
  TORCH_CHECK(loc.size(1) >= 2, op, ": the dimension d = loc.size(-1) must be at least 2, got ", loc.size(1));
  TORCH_CHECK(kappa.dim() == 1 && kappa.size(0) == loc.size(0), op,
              ": concentration must have shape (batch,) = (", loc.size(0), ",), got ", kappa.sizes());
  TORCH_CHECK(at::isFloatingType(loc.scalar_type()), op, ": loc must be a floating tensor, got ",
              loc.scalar_type());
  TORCH_CHECK(loc.scalar_type() == kappa.scalar_type(), op, ": loc and concentration must have the same dtype, got ",
              loc.scalar_type(), " and ", kappa.scalar_type());
  check_same_device(op, {{"loc", loc}, {"concentration", kappa}});
  TORCH_CHECK(num_samples >= 0, op, ": num_samples must be non-negative, got ", num_samples);
  TORCH_CHECK(loc.size(0) == 0 || num_samples <= (philox::kMaxIndex - 1) / loc.size(0), op,
              ": num_samples * batch must be below 2^48");
  TORCH_CHECK(loc.size(1) <= (int64_t(1) << 33), op, ": d must be below 2^33, got ", loc.size(1));
}

}  // namespace vmfdist
