// CPU kernels of the power spherical sampler and its backward: the vMF sampler's loops
// (sphere_sample_cpu.h: the tangent normals, the reflection of vmfdist/vmf.h;
// sphere_backward_cpu.h: the gradient through the reflection) with the marginal of
// vmfdist/power_spherical.h and its dt/dkappa.  A row depends only on (seed, offset, row index), so any thread
// count gives the same tensor.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "vmfdist/philox.h"
#include "vmfdist/power_spherical.h"
#include "vmfdist/vmf.h"
#include "host/power_spherical_host.h"
#include "host/random_state.h"
#include "cpu/sphere_backward_cpu.h"
#include "cpu/sphere_sample_cpu.h"

namespace vmfdist {
namespace {

// The power spherical marginal of the shared sampler: two Gamma variates (power_spherical.h).
struct PowerSphericalMarginal {
  static constexpr const char* name = "power_spherical_sample";
  double d;
  explicit PowerSphericalMarginal(double dim) : d(dim) {}
  vmf::Marginal draw(philox::PhiloxStream& s, double kappa) const {
    return power_spherical::sample_marginal(s, d, kappa);
  }
};

// The marginal's dt/dkappa (power_spherical.h), D = psi(alpha + beta) - psi(alpha) recomputed only
// when kappa changes.  Where the result is rounded to float32 or narrower and d >= 8, panels of 12
// nodes instead of 16, a quarter fewer: their error, at most 1.03e-8 relative over d = 8..3000,
// kappa = 0..1e8 and quantiles 1e-6..1 - 1e-6 against mpmath (2.9e-7 at d = 5, 4.3e-8 at d = 6,
// 1.7e-8 at d = 7, hence the threshold), is a fraction of float32's rounding, 3e-8 to 6e-8.
struct PowerSphericalMarginalGrad {
  double d;
  bool twelve;
  double kappa_cached = NAN, dg = NAN;
  PowerSphericalMarginalGrad(double dim, bool single) : d(dim), twelve(single && dim >= 8.0) {}
  double operator()(double omt, double kappa) {
    if (!(kappa == kappa_cached)) {  // NaN never equals: recomputed, harmless
      const double beta = 0.5 * (d - 1.0);
      dg = kappa >= 0.0 && !is_inf(kappa) ? power_spherical::digamma_diff(beta + kappa, beta) : NAN;  // else unused
      kappa_cached = kappa;
    }
    return twelve ? power_spherical::dt_dkappa_d<12>(omt, kappa, d, dg)
                  : power_spherical::dt_dkappa_d<16>(omt, kappa, d, dg);
  }
};

// The kernels of power_spherical::Ops (host/power_spherical_host.h, shared with CUDA).
struct CpuPowerSpherical : CpuSeeds, sphere_cpu::Backward<PowerSphericalMarginalGrad> {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const SeedOffset& so) {
    sphere_cpu::launch_sample<PowerSphericalMarginal>(x, omw, loc, kappa, so);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("power_spherical_sample", &power_spherical::Ops<CpuPowerSpherical>::sample);
  m.impl("power_spherical_sample_backward", &power_spherical::Ops<CpuPowerSpherical>::sample_backward);
}

}  // namespace vmfdist
