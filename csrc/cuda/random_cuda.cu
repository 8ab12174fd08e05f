// CUDA kernels for the counter-based random ops: grid-stride loops over the same
// per-element functors of philox.h that the CPU kernels call, so raw words and
// uniforms are bit-identical to the CPU results.  The operators themselves (checks,
// seed, allocation) are shared with the CPU: philox::Ops in host/philox_host.h.
//
// philox_uniform / philox_normal are factory ops (no tensor inputs); the
// BackendSelect kernel in csrc/ops.cpp routes them here when device is CUDA.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include "host/philox_host.h"
#include "vmfdist/philox.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using launch::blocks_for;
using launch::kThreads;

__global__ void philox4x32_kernel(const int64_t* __restrict__ ctr, const int64_t* __restrict__ key,
                                  int64_t* __restrict__ out, int64_t n, int rounds) {
  for (int64_t i : launch::grid_stride(n)) {
    philox::block_row(ctr + 4 * i, key + 2 * i, rounds, out + 4 * i);
  }
}

// The functor is built in the kernel from the [seed, offset] pair on the device
// (random_state.cuh), so the launch needs no host value of the seed.
template <class scalar_t, template <typename> class Fn>
__global__ void fill_kernel(scalar_t* __restrict__ out, int64_t n, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const Fn<scalar_t> fn{so.seed, so.offset};
  for (int64_t i : launch::grid_stride(n)) {
    out[i] = fn(static_cast<uint64_t>(i));
  }
}

struct CudaRandom : CudaSeeds {
  static constexpr at::DeviceType kDevice = at::kCUDA;

  static void philox4x32(const at::Tensor& counter, const at::Tensor& key, int rounds, at::Tensor& out) {
    const int64_t n = counter.size(0);
    philox4x32_kernel<<<blocks_for(n), kThreads, 0, launch::stream()>>>(
        counter.const_data_ptr<int64_t>(), key.const_data_ptr<int64_t>(), out.mutable_data_ptr<int64_t>(), n, rounds);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <class scalar_t, template <typename> class Fn>
  static void fill(at::Tensor& out, const int64_t* seed_offset) {
    const int64_t n = out.numel();
    fill_kernel<scalar_t, Fn><<<blocks_for(n), kThreads, 0, launch::stream()>>>(out.mutable_data_ptr<scalar_t>(), n,
                                                                                seed_offset);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("philox4x32", &philox::Ops<CudaRandom>::philox4x32);
  m.impl("philox_uniform", &philox::Ops<CudaRandom>::uniform);
  m.impl("philox_normal", &philox::Ops<CudaRandom>::normal);
}

}  // namespace vmfdist
