// CUDA kernel of the power spherical sampler over the host-device math of
// vmfdist/power_spherical.h (the marginal) and vmfdist/vmf.h (the reflection), the same code
// the CPU loop in csrc/cpu/power_spherical_cpu.cpp calls.
//
// The kernels are the vMF sampler's (sphere_sample.cuh), with the power spherical marginal.
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

// The kernel launch of power_spherical::Ops (host/power_spherical_host.h, shared with the CPU).
struct CudaPowerSpherical : CudaSeeds {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const int64_t* seed_offset) {
    sphere::launch_sample<PowerSphericalMarginal>(x, omw, loc, kappa, seed_offset);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("power_spherical_sample", &power_spherical::Ops<CudaPowerSpherical>::sample);
  m.impl("power_spherical_sample_backward", &power_spherical::composed_sample_backward);
}

}  // namespace vmfdist
