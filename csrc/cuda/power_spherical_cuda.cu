// CUDA kernel of the power spherical sampler over the host-device math of
// vmfdist/power_spherical.h (the marginal) and vmfdist/vmf.h (the reflection), the same code
// the CPU loop in csrc/cpu/power_spherical_cpu.cpp calls.
//
// The kernels are the vMF sampler's and its backward's (sphere_sample.cuh, sphere_backward.cuh),
// with the power spherical marginal.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "vmfdist/power_spherical.h"
#include "vmfdist/vmf.h"
#include "host/power_spherical_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"
#include "cuda/sphere_backward.cuh"
#include "cuda/sphere_sample.cuh"

namespace vmfdist {
namespace {

// The marginal of the power spherical sampler (sphere_sample.cuh): two Gamma variates
// (power_spherical.h).
struct PowerSphericalMarginal {
  static constexpr const char* name = "power_spherical_sample";
  static __device__ vmf::Marginal draw(uint64_t seed, uint64_t offset, uint64_t row, double d, double kappa) {
    return power_spherical::sample_marginal(seed, offset, row, d, kappa);
  }
};

// dt/dkappa of the power spherical marginal (power_spherical.h), for the shared backward
// (sphere_backward.cuh), in double with 16-node panels (the CPU takes 12 where the result is
// float32 and d >= 8: both within float32's rounding of the exact value).
struct PowerSphericalMarginalGrad {
  static __device__ double at(double omt, double kappa, double d) { return power_spherical::dt_dkappa(omt, kappa, d); }
};

// The kernel launches of power_spherical::Ops (host/power_spherical_host.h, shared with the CPU).
struct CudaPowerSpherical : CudaSeeds, sphere::Backward<PowerSphericalMarginalGrad> {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const int64_t* seed_offset) {
    sphere::launch_sample<PowerSphericalMarginal>(x, omw, loc, kappa, seed_offset);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("power_spherical_sample", &power_spherical::Ops<CudaPowerSpherical>::sample);
  m.impl("power_spherical_sample_backward", &power_spherical::Ops<CudaPowerSpherical>::sample_backward);
}

}  // namespace vmfdist
