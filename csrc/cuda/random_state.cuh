// The CUDA side of csrc/host/random_state.h: the (seed, offset) of a random op as an
// int64 tensor [seed, offset] of shape (2,) *on the device*, written by a one-thread
// kernel, so that
//   * without an explicit seed the pair comes from the CUDA generator's Philox state
//     (philox_cuda_state(4)): under CUDA-graph capture that state holds pointers to the
//     generator's seed and offset plus an intra-graph increment, which
//     at::cuda::philox::unpack resolves on the device at replay time -- each replay draws
//     fresh streams and nothing is read back to the host;
//   * an explicit seed takes the same path (a non-captured state built from the ints).
// The sampling kernels read the pair through a `const int64_t*` (load_seed_offset), and
// ops whose backward regenerates noise return the tensor itself.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxUtils.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdint>
#include <mutex>
#include <optional>

#include "cuda/launch.cuh"
#include "host/random_state.h"
#include "vmfdist/philox.h"

namespace vmfdist {

// Offsets taken from the CUDA generator are multiples of 4 (torch requires increments that
// are), reduced modulo 2^48 so that offset + 3 < 2^48: an op may use offsets offset ..
// offset + 3, and the streams repeat only after 2^46 calls.
namespace {
__global__ void write_seed_offset_kernel(at::PhiloxCudaState state, int64_t* out) {
  const auto so = at::cuda::philox::unpack(state);
  out[0] = static_cast<int64_t>(std::get<0>(so));
  out[1] = static_cast<int64_t>(std::get<1>(so) & static_cast<uint64_t>(philox::kMaxOffset - 1));
}
}  // namespace

// The [seed, offset] tensor of a CUDA random op on `device` (see the header comment); the
// argument checks are those of the CPU (check_random_args).
inline at::Tensor cuda_seed_offset(const char* op, const std::optional<at::Generator>& generator,
                                   std::optional<int64_t> seed, std::optional<int64_t> offset, int64_t streams,
                                   const at::Device& device) {
  check_random_args(op, generator, seed, offset, streams);
  TORCH_CHECK(device.is_cuda(), op, ": expected CUDA tensors here, got ", device);
  at::PhiloxCudaState state;
  if (seed.has_value()) {
    state = at::PhiloxCudaState(static_cast<uint64_t>(*seed), static_cast<uint64_t>(offset.value_or(0)));
  } else {
    // device "cuda" without an index (a factory op's device argument) means the current device
    const at::Device dev = device.has_index() ? device : at::Device(at::kCUDA, c10::cuda::current_device());
    auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        generator, at::cuda::detail::getDefaultCUDAGenerator(dev.index()));
    TORCH_CHECK(gen->device() == dev, op, ": generator is on ", gen->device(), ", the tensors on ", dev);
    std::lock_guard<std::mutex> lock(gen->mutex_);
    state = gen->philox_cuda_state(4);  // the op uses at most 4 consecutive offsets (streams <= 4)
  }
  TORCH_CHECK(streams <= 4, op, ": at most 4 offsets per call");
  at::Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kLong).device(device));
  write_seed_offset_kernel<<<1, 1, 0, launch::stream()>>>(state, out.mutable_data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// The seed_offset argument of a CUDA backward op: int64 (2,) on the op's device.
inline const int64_t* seed_offset_ptr_cuda(const char* op, const at::Tensor& t, const at::Device& device) {
  check_seed_offset_tensor(op, t, device);
  TORCH_CHECK(t.is_contiguous(), op, ": seed_offset must be contiguous");
  return t.const_data_ptr<int64_t>();
}

// The seed half of a CUDA backend (the interface is described at CpuSeeds, host/random_state.h):
// the pair stays on the device and the kernels read it through a pointer.
struct CudaSeeds {
  using Seed = const int64_t*;
  using Guard = c10::cuda::CUDAGuard;
  struct Drawn {
    at::Tensor t;
    Seed seed;
    at::Tensor tensor() const { return t; }
  };
  static Drawn draw(const char* op, const std::optional<at::Generator>& generator, std::optional<int64_t> seed,
                    std::optional<int64_t> offset, int64_t streams, const at::Device& device) {
    at::Tensor t = cuda_seed_offset(op, generator, seed, offset, streams, device);
    return {t, t.const_data_ptr<int64_t>()};
  }
  static Seed read(const char* op, const at::Tensor& t, int64_t, const at::Device& device) {
    return seed_offset_ptr_cuda(op, t, device);
  }
};

// In a kernel: the pair as the uint64 values the Philox streams take.
__device__ __forceinline__ SeedOffset load_seed_offset(const int64_t* so) {
  return {static_cast<uint64_t>(so[0]), static_cast<uint64_t>(so[1])};
}

}  // namespace vmfdist
