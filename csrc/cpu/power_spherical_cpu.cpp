// CPU kernel of the power spherical sampler: the vMF sampler's loop (sphere_sample_cpu.h: the
// tangent normals, the reflection of vmfdist/vmf.h) with the marginal of
// vmfdist/power_spherical.h.  A row depends only on (seed, offset, row index), so any thread
// count gives the same tensor.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "vmfdist/philox.h"
#include "vmfdist/power_spherical.h"
#include "vmfdist/vmf.h"
#include "host/power_spherical_host.h"
#include "host/random_state.h"
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

// The kernel of power_spherical::Ops (host/power_spherical_host.h, shared with CUDA).
struct CpuPowerSpherical : CpuSeeds {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const SeedOffset& so) {
    sphere_cpu::launch_sample<PowerSphericalMarginal>(x, omw, loc, kappa, so);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("power_spherical_sample", &power_spherical::Ops<CpuPowerSpherical>::sample);
}

}  // namespace vmfdist
