// Host side of the power spherical sampler, shared by the CPU and CUDA backends (torch
// headers; not for device code): the argument checks and the operator
// (power_spherical::Ops), each backend supplying only its kernels.  The sampler's backward,
// power_spherical_sample_backward, is vmf_sample_backward's operator (the gradient through the
// reflection is the same map) with the backend's passes for this marginal's dt/dkappa
// (cpu/sphere_backward_cpu.h, cuda/sphere_backward.cuh).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "host/vmf_host.h"

namespace vmfdist {
namespace power_spherical {

// The operators of one backend.  Backend: the seed interface (CpuSeeds, CudaSeeds) and
//   sample(x, omw, loc, kappa, seed)   fill x (n, B, d) and omw = 1 - t (n, B); loc, kappa
//                                      contiguous, n * B > 0; row r from the streams
//                                      (seed, offset, r) and (seed, offset + 1, r)
// and for sample_backward the three passes of vmf::Ops (host/vmf_host.h) with dt/dkappa.
template <class Backend>
struct Ops {
  static std::tuple<at::Tensor, at::Tensor> sample_backward(const at::Tensor& grad_x,
                                                            const std::optional<at::Tensor>& grad_omt,
                                                            const at::Tensor& loc, const at::Tensor& kappa,
                                                            const at::Tensor& x, const at::Tensor& omt, bool loc_grad,
                                                            bool concentration_grad) {
    return vmf::Ops<Backend>::sample_backward_as("power_spherical_sample_backward", grad_x, grad_omt, loc, kappa, x,
                                                 omt, loc_grad, concentration_grad);
  }

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
