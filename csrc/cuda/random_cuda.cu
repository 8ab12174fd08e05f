// CUDA kernels for the counter-based random ops: grid-stride loops over the
// same per-element functors (vmfdist/random_ops.h, over philox.h) that the CPU
// kernels call, so raw words and uniforms are bit-identical to the CPU results.
//
// philox_uniform / philox_normal are factory ops (no tensor inputs); the
// BackendSelect kernel in csrc/ops.cpp routes them here when device is CUDA.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "host/random_checks.h"
#include "vmfdist/random_ops.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using launch::blocks_for;
using launch::kThreads;

__global__ void philox4x32_kernel(const int64_t* __restrict__ ctr, const int64_t* __restrict__ key,
                                  int64_t* __restrict__ out, int64_t n, int rounds) {
  for (int64_t i : launch::grid_stride(n)) {
    philox4x32_row(ctr + 4 * i, key + 2 * i, rounds, out + 4 * i);
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

at::Tensor philox4x32_cuda(const at::Tensor& counter_in, const at::Tensor& key_in, int64_t rounds) {
  TORCH_CHECK(counter_in.is_cuda(), "philox4x32: counter must be a CUDA tensor here, got ", counter_in.device());
  const auto [counter, key] = check_philox4x32_args(counter_in, key_in, rounds);
  const c10::cuda::CUDAGuard guard(counter.device());
  const int64_t n = counter.size(0);
  at::Tensor out = at::empty({n, 4}, counter.options());
  if (n == 0) return out;
  philox4x32_kernel<<<blocks_for(n), kThreads, 0, launch::stream()>>>(
      counter.const_data_ptr<int64_t>(), key.const_data_ptr<int64_t>(), out.mutable_data_ptr<int64_t>(), n,
      static_cast<int>(rounds));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

template <template <typename> class Fn>
at::Tensor philox_fill_cuda(const char* op, c10::SymIntArrayRef size_in, at::ScalarType dtype, at::Device device,
                            const std::optional<at::Generator>& generator, std::optional<int64_t> seed,
                            std::optional<int64_t> offset) {
  const at::IntArrayRef size = C10_AS_INTARRAYREF_SLOW(size_in);
  check_philox_factory(op, size, dtype);
  const c10::cuda::CUDAGuard guard(device);
  const at::Tensor so = cuda_seed_offset(op, generator, seed, offset, 1, device);
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(dtype).device(device));
  const int64_t n = out.numel();
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "vmfdist_philox_fill", [&] {
    fill_kernel<scalar_t, Fn><<<blocks_for(n), kThreads, 0, launch::stream()>>>(
        out.mutable_data_ptr<scalar_t>(), n, so.const_data_ptr<int64_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor philox_uniform_cuda(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                               std::optional<at::Generator> generator, std::optional<int64_t> seed,
                               std::optional<int64_t> offset) {
  return philox_fill_cuda<PhiloxUniformFn>("philox_uniform", size, dtype, device, generator, seed, offset);
}

at::Tensor philox_normal_cuda(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                              std::optional<at::Generator> generator, std::optional<int64_t> seed,
                              std::optional<int64_t> offset) {
  return philox_fill_cuda<PhiloxNormalFn>("philox_normal", size, dtype, device, generator, seed, offset);
}

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("philox4x32", &philox4x32_cuda);
  m.impl("philox_uniform", &philox_uniform_cuda);
  m.impl("philox_normal", &philox_normal_cuda);
}

}  // namespace vmfdist
