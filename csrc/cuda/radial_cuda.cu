// CUDA kernels of the fused radial noise (math and stream layout: vmfdist/radial.h),
// the same passes as csrc/cpu/radial_cpu.cpp: (1) one thread block per chunk writes
// the normals into the output and reduces their squares; (2) one thread per group
// adds the chunk sums in order and draws the radius; (3) an elementwise pass forms
// loc + scale * eps * coef in place (the eps copied to `noise` first when the caller keeps
// them).  The scale gradient reads the kept eps or regenerates them per element.
// The operators (checks, seed, outputs) are shared with the CPU: radial::Ops in host/radial_host.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "vmfdist/radial.h"
#include "host/radial_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using radial::kRadialChunk;
using radial::RadialLayout;
using launch::blocks_for;
using launch::kThreads;

template <class scalar_t>
__global__ void radial_pass1(scalar_t* __restrict__ out, double* __restrict__ partial, int64_t units,
                             int64_t nchunk, int64_t length, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  for (int64_t u : launch::block_stride(units)) {
    const int64_t t = u / nchunk, c = u % nchunk;
    const int64_t start = c * kRadialChunk;
    const int64_t n = min(kRadialChunk, length - start);
    scalar_t* dst = out + t * length + start;
    double acc = 0.0;
    for (int64_t q = threadIdx.x; 4 * q < n; q += blockDim.x) {
      double z[4];
      fast_normal::normal4_for<scalar_t>(seed, offset, static_cast<uint64_t>(t), static_cast<uint32_t>((start >> 2) + q), z);
      for (int k = 0; k < 4; ++k) {
        const int64_t i = 4 * q + k;
        if (i < n) {
          const scalar_t e = static_cast<scalar_t>(z[k]);
          dst[i] = e;
          const double ed = static_cast<double>(e);
          acc += ed * ed;
        }
      }
    }
    const double sum = launch::block_sum(acc);
    if (threadIdx.x == 0) partial[u] = sum;
  }
}

__global__ void radial_coef(const double* __restrict__ partial, double* __restrict__ coef, int64_t streams,
                            int64_t nchunk, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  for (int64_t t : launch::grid_stride(streams)) {
    double ss = 0.0;
    for (int64_t c = 0; c < nchunk; ++c) ss += partial[t * nchunk + c];
    coef[t] = radial::group_coef(seed, offset, static_cast<uint64_t>(t), ss);
  }
}

template <class scalar_t>
__global__ void radial_pass2(scalar_t* __restrict__ out, const scalar_t* __restrict__ loc,
                             const scalar_t* __restrict__ scale, const double* __restrict__ coef, int64_t total,
                             int64_t length, int64_t event) {
  for (int64_t i : launch::grid_stride(total)) {
    const int64_t j = i % event;  // position in the event
    const int64_t t = i / length;  // stream index s * groups + g
    out[i] = static_cast<scalar_t>(static_cast<double>(loc[j]) +
                                   static_cast<double>(scale[j]) * (static_cast<double>(out[i]) * coef[t]));
  }
}

template <class scalar_t>
__global__ void radial_scale_grad_kernel(const scalar_t* __restrict__ grad, const double* __restrict__ coef,
                                         const scalar_t* __restrict__ noise, scalar_t* __restrict__ out, int64_t S,
                                         int64_t groups, int64_t length, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  const int64_t event = groups * length;
  for (int64_t j : launch::grid_stride(event)) {
    const int64_t g = j / length, k = j % length;
    double acc = 0.0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t = s * groups + g;
      double e;
      if (noise != nullptr) {  // kept by the forward pass
        e = static_cast<double>(noise[s * event + j]);
      } else {
        double z[4];
        fast_normal::normal4_for<scalar_t>(seed, offset, static_cast<uint64_t>(t), static_cast<uint32_t>(k >> 2), z);
        e = static_cast<double>(static_cast<scalar_t>(z[k & 3]));
      }
      acc += static_cast<double>(grad[s * event + j]) * (e * coef[t]);
    }
    out[j] = static_cast<scalar_t>(acc);
  }
}

struct CudaRadial : CudaSeeds {
  static void noise(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, const at::Tensor& loc,
                    const at::Tensor& scale, const RadialLayout& lay, const int64_t* pso) {
    const int64_t streams = out.size(0) * lay.groups;
    const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
    const int64_t units = streams * nchunk;
    at::Tensor partial = at::empty({units}, loc.options().dtype(at::kDouble));
    const auto stream = launch::stream();
    const int64_t event = lay.groups * lay.length;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "radial_noise", [&] {
      radial_pass1<scalar_t><<<blocks_for(units, 1), kThreads, 0, stream>>>(
          out.mutable_data_ptr<scalar_t>(), partial.mutable_data_ptr<double>(), units, nchunk, lay.length, pso);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (noise.numel() > 0) noise.copy_(out);  // the eps, kept for the backward (same stream)
      radial_coef<<<blocks_for(streams), kThreads, 0, stream>>>(
          partial.const_data_ptr<double>(), coef.mutable_data_ptr<double>(), streams, nchunk, pso);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      radial_pass2<scalar_t><<<blocks_for(streams * lay.length), kThreads, 0, stream>>>(
          out.mutable_data_ptr<scalar_t>(), loc.const_data_ptr<scalar_t>(), scale.const_data_ptr<scalar_t>(),
          coef.const_data_ptr<double>(), streams * lay.length, lay.length, event);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }

  static void scale_grad(at::Tensor& out, const at::Tensor& grad, const at::Tensor& coef, const at::Tensor& noise,
                         const RadialLayout& lay, const int64_t* pso) {
    const int64_t event = lay.groups * lay.length;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "radial_noise_scale_grad", [&] {
      radial_scale_grad_kernel<scalar_t><<<blocks_for(event), kThreads, 0, launch::stream()>>>(
          grad.const_data_ptr<scalar_t>(), coef.const_data_ptr<double>(),
          noise.defined() ? noise.const_data_ptr<scalar_t>() : nullptr, out.mutable_data_ptr<scalar_t>(),
          grad.size(0), lay.groups, lay.length, pso);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("radial_noise", &radial::Ops<CudaRadial>::noise);
  m.impl("radial_noise_scale_grad", &radial::Ops<CudaRadial>::scale_grad);
}

}  // namespace vmfdist
