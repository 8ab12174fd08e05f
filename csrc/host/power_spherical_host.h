// Host side of the power spherical sampler, shared by the CPU and CUDA backends (torch
// headers; not for device code): the argument checks and the operator
// (power_spherical::Ops), each backend supplying only its kernel.  The backward of the
// sampler is no op of its own: vmfdist/_ops/power_spherical.py combines vmf_sample_backward
// (the gradient through the reflection, the same map as the vMF sampler's) with
// power_spherical_marginal_grad (the marginal's dt/dkappa).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "vmfdist/philox.h"
#include "host/tensor_checks.h"

namespace vmfdist {
namespace power_spherical {

// power_spherical_sample(loc (B, d), concentration (B,), num_samples, ...).
// The seed and offset are checked by check_random_args (random_state.h).
inline void check_sample_args(const at::Tensor& loc, const at::Tensor& kappa, int64_t num_samples) {
  constexpr const char* op = "power_spherical_sample";
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

// The operator of one backend.  Backend: the seed interface (CpuSeeds, CudaSeeds) and
//   sample(x, omw, loc, kappa, seed)   fill x (n, B, d) and omw = 1 - t (n, B); loc, kappa
//                                      contiguous, n * B > 0; row r from the streams
//                                      (seed, offset, r) and (seed, offset + 1, r)
template <class Backend>
struct Ops {
  static std::tuple<at::Tensor, at::Tensor> sample(const at::Tensor& loc_in, const at::Tensor& kappa_in,
                                                   c10::SymInt num_samples_in, std::optional<at::Generator> generator,
                                                   std::optional<int64_t> seed, std::optional<int64_t> offset) {
    const int64_t num_samples = num_samples_in.expect_int();
    check_sample_args(loc_in, kappa_in, num_samples);
    const typename Backend::Guard guard(loc_in.device());
    const auto drawn = Backend::draw("power_spherical_sample", generator, seed, offset, 2, loc_in.device());
    const at::Tensor loc = loc_in.contiguous(), kappa = kappa_in.contiguous();
    at::Tensor x = at::empty({num_samples, loc.size(0), loc.size(1)}, loc.options());
    at::Tensor omw = at::empty({num_samples, loc.size(0)}, loc.options());
    if (num_samples * loc.size(0) > 0) Backend::sample(x, omw, loc, kappa, drawn.seed);
    return {x, omw};
  }
};

}  // namespace power_spherical
}  // namespace vmfdist
