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

#include "host/vmf_host.h"

namespace vmfdist {
namespace power_spherical {

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
    vmf::check_vmf_sample_args(loc_in, kappa_in, num_samples, "power_spherical_sample");  // the same arguments
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
