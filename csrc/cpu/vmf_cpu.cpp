// CPU kernels for the von Mises-Fisher ops: at::parallel_for over sample rows (the
// backward: over sample rows, then over batch rows for the sums over samples), each row
// computed by the host-device math of vmfdist/vmf.h.  A row depends
// only on (seed, offset, row index), so any thread count gives the same tensor.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "vmfdist/fast_normal.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/vmf.h"
#include "host/random_state.h"
#include "host/vmf_host.h"
#include "cpu/sphere_backward_cpu.h"
#include "cpu/sphere_sample_cpu.h"

namespace vmfdist {
namespace {

// The vMF marginal of the shared sampler (sphere_sample_cpu.h): Wood's rejection sampler (the
// inverse CDF for d = 3), its envelope recomputed only when kappa changes from one row to the next.
struct VmfMarginal {
  static constexpr const char* name = "vmf_sample";
  double d;
  double kappa_cached = NAN;
  vmf::Wood wood{};
  explicit VmfMarginal(double dim) : d(dim) {}
  vmf::Marginal draw(philox::PhiloxStream& s, double kappa) {
    if (!(kappa == kappa_cached) && d != 3.0) {  // NaN never equals: recomputed, harmless
      wood = vmf::wood_setup(d, kappa);
      kappa_cached = kappa;
    }
    return vmf::sample_marginal(s, d, kappa, wood);
  }
};

// The vMF marginal's dw/dkappa (vmf.h), 1 - A_d(kappa) recomputed only when kappa changes.
struct VmfMarginalGrad {
  double d;
  double kappa_cached = NAN, c = NAN;
  VmfMarginalGrad(double dim, bool /*single*/) : d(dim) {}
  double operator()(double omw, double kappa) {
    if (!(kappa == kappa_cached)) {  // NaN never equals: recomputed, harmless
      c = kappa >= 0.0 && !is_inf(kappa) ? bessel::iv_ratio(0.5 * d, kappa, true) : NAN;  // else unused
      kappa_cached = kappa;
    }
    return vmf::dw_dkappa_c(omw, kappa, d, c);
  }
};

// The kernel of vmf::Ops (host/vmf_host.h, shared with CUDA).
struct CpuVmf : CpuSeeds, sphere_cpu::Backward<VmfMarginalGrad> {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const SeedOffset& so) {
    sphere_cpu::launch_sample<VmfMarginal>(x, omw, loc, kappa, so);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("vmf_sample", &vmf::Ops<CpuVmf>::sample);
  m.impl("vmf_sample_backward", &vmf::Ops<CpuVmf>::sample_backward);
}

}  // namespace vmfdist
