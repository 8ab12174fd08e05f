// CUDA kernel of rdp_kl (the KL of one RDP grouping and its gradient, include/vmfdist/rdp.h): one
// thread per radius factor writing its term and derivatives, one more thread the directions'
// part, and the terms summed on the device (torch's sum: a fixed order for a given size).  No
// value is read back to the host.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "vmfdist/rdp.h"
#include "host/rdp_host.h"
#include "cuda/launch.cuh"

namespace vmfdist {
namespace {

using launch::blocks_for;
using launch::kThreads;

// terms[j] (j < G: local factor j, j = G: the global one) and their derivatives; terms[G + 1] and
// *g_log_kappa: the directions' part.
template <typename scalar_t>
__global__ void rdp_kl_terms(double* __restrict__ terms, scalar_t* __restrict__ g_local,
                             scalar_t* __restrict__ g_glob, scalar_t* __restrict__ g_log_kappa,
                             const scalar_t* __restrict__ local, const scalar_t* __restrict__ glob,
                             const scalar_t* __restrict__ log_kappa, const scalar_t* __restrict__ prior_kappa,
                             const scalar_t* __restrict__ tau_local, const scalar_t* __restrict__ tau_global,
                             int64_t G, double dim, bool uniform) {
  for (int64_t j : launch::grid_stride(G + 2)) {
    if (j == G + 1) {
      const rdp::Directions d = rdp::directions(static_cast<double>(*log_kappa), static_cast<double>(*prior_kappa),
                                                dim, static_cast<double>(G), uniform);
      terms[j] = d.kl;
      *g_log_kappa = static_cast<scalar_t>(d.g_log_kappa);
      continue;
    }
    const bool global = j == G;
    const scalar_t* p = global ? glob : local + j;
    scalar_t* o = global ? g_glob : g_local + j;
    const int64_t stride = global ? 1 : G;
    const double tau = static_cast<double>(global ? *tau_global : *tau_local);
    terms[j] = rdp::radius_factor(p, o, stride, 1.0 / (tau * tau), -2.0 * ::log(tau));
  }
}

struct CudaRdp {
  using Guard = c10::cuda::CUDAGuard;

  static void kl(at::Tensor& kl, at::Tensor& g_log_kappa, at::Tensor& g_local, at::Tensor& g_glob,
                 const rdp::Operands& x, int64_t dim, bool uniform) {
    const int64_t G = x.groups();
    at::Tensor terms = at::empty({G + 2}, x.local.options().dtype(at::kDouble));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.local.scalar_type(), "rdp_kl", [&] {
      rdp_kl_terms<scalar_t><<<blocks_for(G + 2), kThreads, 0, launch::stream()>>>(
          terms.mutable_data_ptr<double>(), g_local.mutable_data_ptr<scalar_t>(), g_glob.mutable_data_ptr<scalar_t>(),
          g_log_kappa.mutable_data_ptr<scalar_t>(), x.local.const_data_ptr<scalar_t>(),
          x.glob.const_data_ptr<scalar_t>(), x.log_kappa.const_data_ptr<scalar_t>(),
          x.prior_kappa.const_data_ptr<scalar_t>(), x.tau_local.const_data_ptr<scalar_t>(),
          x.tau_global.const_data_ptr<scalar_t>(), G, static_cast<double>(dim), uniform);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    kl.copy_(terms.sum());
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) { m.impl("rdp_kl", &rdp::Ops<CudaRdp>::kl); }

}  // namespace vmfdist
