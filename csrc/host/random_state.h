// Where a random op's (seed, offset) comes from -- host side, shared by every
// random op of both backends (torch headers; not for device code).
//
// Every random op takes `Generator? generator=None, int? seed=None, int? offset=None`
// (keyword-only) and is tagged nondeterministic_seeded, like torch's own random ops:
//
//  * seed given:  the Philox key is that seed (0 <= seed < 2^63) and the first stream
//    offset is `offset` (default 0); an op using k offsets needs offset + k <= 2^48.
//    Deterministic; for tests and reproducibility.
//  * seed None:   drawn inside the op from `generator`, or the device's default
//    generator (CPU: at::detail::getDefaultCPUGenerator(); CUDA: the current device's
//    default CUDA generator), so torch.compile, torch.jit.trace and CUDA graphs see an
//    ordinary seeded op and draw fresh values on each call.
//      CPU:  one random64() of the CPU generator (under its mutex), shifted to 63
//            bits, is the seed; the offset is 0.
//      CUDA: philox_cuda_state(4) of the CUDA generator: its seed and its offset (a
//            multiple of 4, reduced modulo 2^48, so the streams repeat only after 2^46
//            calls) are read *on the device* (csrc/cuda/random_state.cuh), so CUDA
//            graph capture works and nothing is read back to the host.
//
// Ops whose backward regenerates the noise (radial_noise, kron_eigen_sample) return
// the pair they used as an int64 tensor [seed, offset] of shape (2,) on the output's
// device; the backward ops take that tensor.  (A seed drawn from a CUDA generator may
// be any uint64; the tensor holds its bits.)
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <mutex>
#include <optional>

#include "vmfdist/philox.h"

namespace vmfdist {

// A pair (seed, offset) in the form the kernels use.
struct SeedOffset {
  uint64_t seed, offset;
};

// The checks common to both backends: explicit seed and generator are exclusive,
// offset needs seed, 0 <= seed < 2^63, 0 <= offset <= 2^48 - streams (the op uses
// offsets offset .. offset + streams - 1; see the counter layout in philox.h).
inline void check_random_args(const char* op, const std::optional<at::Generator>& generator,
                              std::optional<int64_t> seed, std::optional<int64_t> offset, int64_t streams) {
  if (seed.has_value()) {
    TORCH_CHECK(!(generator.has_value() && generator->defined()), op,
                ": pass either generator or seed, not both");
    TORCH_CHECK(*seed >= 0, op, ": seed must be in [0, 2^63), got ", *seed);
    const int64_t off = offset.value_or(0);
    TORCH_CHECK(off >= 0 && off <= philox::kMaxOffset - streams, op, ": offset must be in [0, 2^48 - ", streams,
                "] (the op uses ", streams, streams == 1 ? " offset" : " consecutive offsets", "), got ", off);
  } else {
    TORCH_CHECK(!offset.has_value(), op, ": offset needs an explicit seed (pass seed=... too)");
  }
}

// CPU ops: the explicit pair, or one draw from the CPU generator.
inline SeedOffset cpu_seed_offset(const char* op, const std::optional<at::Generator>& generator,
                                  std::optional<int64_t> seed, std::optional<int64_t> offset, int64_t streams) {
  check_random_args(op, generator, seed, offset, streams);
  if (seed.has_value()) return {static_cast<uint64_t>(*seed), static_cast<uint64_t>(offset.value_or(0))};
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return {gen->random64() >> 1, 0};
}

// The (2,) int64 tensor [seed, offset] returned by the ops whose backward regenerates noise.
inline at::Tensor cpu_seed_offset_tensor(const SeedOffset& so) {
  at::Tensor t = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = t.mutable_data_ptr<int64_t>();
  p[0] = static_cast<int64_t>(so.seed);
  p[1] = static_cast<int64_t>(so.offset);
  return t;
}

// The seed_offset argument of a backward op: int64 of shape (2,) on `device`.
inline void check_seed_offset_tensor(const char* op, const at::Tensor& t, const at::Device& device) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.size(0) == 2, op,
              ": seed_offset must be an int64 tensor of shape (2,) (as returned by the forward op), got dtype ",
              t.scalar_type(), " and shape ", t.sizes());
  TORCH_CHECK(t.device() == device, op, ": seed_offset must be on ", device, ", got ", t.device());
}

// CPU backward ops: read the pair (host memory, no synchronisation).
inline SeedOffset read_seed_offset_cpu(const char* op, const at::Tensor& t, int64_t streams) {
  check_seed_offset_tensor(op, t, at::Device(at::kCPU));
  const at::Tensor c = t.contiguous();
  const int64_t* p = c.const_data_ptr<int64_t>();
  TORCH_CHECK(p[1] >= 0 && p[1] <= philox::kMaxOffset - streams, op, ": seed_offset holds the offset ", p[1],
              ", outside [0, 2^48 - ", streams, "]");
  return {static_cast<uint64_t>(p[0]), static_cast<uint64_t>(p[1])};
}

// The seed half of a backend, as the host orchestration shared by both backends uses it
// (kron_host.h, philox_host.h, radial_host.h, vmf_host.h); its CUDA twin is CudaSeeds in
// csrc/cuda/random_state.cuh.
//   Seed                    what the kernels take
//   Guard(device)           the device guard (none on the CPU)
//   draw(op, generator, seed, offset, streams, device) -> Drawn: .seed for the kernels,
//                           .tensor() the (2,) int64 [seed, offset] an op returns
//   read(op, seed_offset, streams, device) -> Seed: a backward op's seed_offset argument
struct CpuSeeds {
  using Seed = SeedOffset;
  struct Guard {
    explicit Guard(const at::Device&) {}
  };
  struct Drawn {
    SeedOffset seed;
    at::Tensor tensor() const { return cpu_seed_offset_tensor(seed); }
  };
  static Drawn draw(const char* op, const std::optional<at::Generator>& generator, std::optional<int64_t> seed,
                    std::optional<int64_t> offset, int64_t streams, const at::Device&) {
    return {cpu_seed_offset(op, generator, seed, offset, streams)};
  }
  static Seed read(const char* op, const at::Tensor& t, int64_t streams, const at::Device&) {
    return read_seed_offset_cpu(op, t, streams);
  }
};

}  // namespace vmfdist
