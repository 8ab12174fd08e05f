// Host side of the power spherical sampler, shared by the CPU and CUDA backends (torch
// headers; not for device code): the argument checks and the operator
// (power_spherical::Ops), each backend supplying only its kernels.  The sampler's backward,
// power_spherical_sample_backward, is vmf_sample_backward's operator (the gradient through the
// reflection is the same map) with the backend's passes for this marginal's dt/dkappa on the CPU
// (cpu/sphere_backward_cpu.h), and composed from other ops on CUDA (composed_sample_backward).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

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

// power_spherical_sample_backward from other ops, for a backend without a kernel of it (CUDA, so
// far): the loc gradient from vmf_sample_backward (the same reflection) and d/dkappa =
// sum_s dL/dt * dt/dkappa with power_spherical_marginal_grad, formed in float64 (dL/dt =
// g.mu - t (g.x - t g.mu) / (1 - t^2) - grad_omt, 0 at the poles), as the CPU kernel forms it.
// (vmfdist/_ops/power_spherical.py still differentiates on CUDA with the same composition in
// torch ops, tested on a GPU; this op awaits a GPU session's test_cuda.py.)
inline std::tuple<at::Tensor, at::Tensor> composed_sample_backward(const at::Tensor& grad_x,
                                                                   const std::optional<at::Tensor>& grad_omt,
                                                                   const at::Tensor& loc, const at::Tensor& kappa,
                                                                   const at::Tensor& x, const at::Tensor& omt,
                                                                   bool loc_grad, bool concentration_grad) {
  vmf::check_vmf_backward_args(grad_x, grad_omt, loc, kappa, x, omt, "power_spherical_sample_backward");
  at::Tensor gl = at::empty({0}, loc.options()), gk = at::empty({0}, loc.options());
  if (loc_grad) {
    static const auto vmf_backward =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("vmfdist::vmf_sample_backward", "")
            .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const std::optional<at::Tensor>&,
                                                      const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                      const at::Tensor&, bool, bool)>();
    gl = std::get<0>(vmf_backward.call(grad_x, std::nullopt, loc, kappa, x, omt, true, false));
  }
  if (concentration_grad) {
    static const auto marginal_grad = c10::Dispatcher::singleton()
                                          .findSchemaOrThrow("vmfdist::power_spherical_marginal_grad", "")
                                          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
    const at::Tensor l = loc.to(at::kDouble), g = grad_x.to(at::kDouble), xd = x.to(at::kDouble);
    const at::Tensor o = omt.to(at::kDouble);
    const at::Tensor mu = l / at::linalg_vector_norm(l, 2, at::IntArrayRef{-1}, true);
    const at::Tensor gm = (g * mu).sum(-1), gx = (g * xd).sum(-1);
    const at::Tensor t = 1 - o, one_m_t2 = o * (2 - o);
    const at::Tensor pos = one_m_t2 > 0;
    at::Tensor dl = gm - at::where(pos, t * (gx - t * gm) / at::where(pos, one_m_t2, at::ones_like(o)),
                                   at::zeros_like(o));
    if (grad_omt.has_value()) dl = dl - grad_omt->to(at::kDouble);
    gk = (dl * marginal_grad.call(o, kappa.to(at::kDouble), loc.size(1))).sum(0).to(loc.scalar_type());
  }
  return {gl, gk};
}

}  // namespace power_spherical
}  // namespace vmfdist
