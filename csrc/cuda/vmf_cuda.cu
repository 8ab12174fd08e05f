// CUDA kernels for the von Mises-Fisher ops over the host-device math of
// vmfdist/vmf.h (the same code the CPU loops in csrc/cpu/vmf_cpu.cpp call).
//
// vmf_sample: the sampler of sphere_sample.cuh (shared with the power spherical op) with
// the vMF marginal: a thread per short row, else a warp per row with the marginals of
// several rows drawn side by side, one per lane.
//
// vmf_sample_backward: the backward of sphere_backward.cuh (shared with the power spherical op)
// with the vMF marginal's dw/dkappa.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include <type_traits>

#include "vmfdist/fast_normal.h"
#include "vmfdist/vmf.h"
#include "host/vmf_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"
#include "cuda/sphere_backward.cuh"
#include "cuda/sphere_sample.cuh"

namespace vmfdist {
namespace {

// The marginal of the vMF sampler (sphere_sample.cuh): Wood's rejection sampler, or the inverse
// CDF for d = 3 (vmf.h).
struct VmfMarginal {
  static constexpr const char* name = "vmf_sample";
  static __device__ vmf::Marginal draw(uint64_t seed, uint64_t offset, uint64_t row, double d, double kappa) {
    return vmf::sample_marginal(seed, offset, row, d, kappa);
  }
};

// dw/dkappa of the vMF marginal (vmf.h), for the shared backward (sphere_backward.cuh).
struct VmfMarginalGrad {
  static __device__ double at(double omw, double kappa, double d) { return vmf::dw_dkappa(omw, kappa, d); }
};

// The kernel launch of vmf::Ops (host/vmf_host.h, shared with the CPU).
struct CudaVmf : CudaSeeds, sphere::Backward<VmfMarginalGrad> {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const int64_t* seed_offset) {
    sphere::launch_sample<VmfMarginal>(x, omw, loc, kappa, seed_offset);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("vmf_sample", &vmf::Ops<CudaVmf>::sample);
  m.impl("vmf_sample_backward", &vmf::Ops<CudaVmf>::sample_backward);
}

}  // namespace vmfdist
