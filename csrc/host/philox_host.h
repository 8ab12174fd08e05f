// Host side of the counter-based random ops, shared by the CPU and CUDA backends
// (torch headers; not for device code): the argument checks and the operators
// themselves (philox::Ops), each backend supplying only its loops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/util/safe_numerics.h>

#include <optional>
#include <utility>

#include "vmfdist/philox.h"

namespace vmfdist {
namespace philox {

// philox4x32(counter, key, rounds): counter int64 (n, 4), key int64 (n, 2), both
// holding values in [0, 2^32), same device; 1 <= rounds <= 16.  Returns the
// contiguous tensors.  (The range check reads the data: a device sync on CUDA;
// this op is a testing and debugging tool.)
inline std::pair<at::Tensor, at::Tensor> check_philox4x32_args(const at::Tensor& counter, const at::Tensor& key,
                                                                int64_t rounds) {
  constexpr const char* op = "philox4x32";
  TORCH_CHECK(counter.scalar_type() == at::kLong, op, ": counter must have dtype int64, got ", counter.scalar_type());
  TORCH_CHECK(key.scalar_type() == at::kLong, op, ": key must have dtype int64, got ", key.scalar_type());
  TORCH_CHECK(counter.dim() == 2 && counter.size(1) == 4, op, ": counter must have shape (n, 4), got ",
              counter.sizes());
  TORCH_CHECK(key.dim() == 2 && key.size(1) == 2, op, ": key must have shape (n, 2), got ", key.sizes());
  TORCH_CHECK(counter.size(0) == key.size(0), op, ": counter and key must have the same number of rows, got ",
              counter.size(0), " and ", key.size(0));
  TORCH_CHECK(counter.device() == key.device(), op, ": counter and key must be on the same device, got counter on ",
              counter.device(), " and key on ", key.device());
  TORCH_CHECK(rounds >= 1 && rounds <= philox::kMaxRounds, op, ": rounds must be in [1, ", philox::kMaxRounds,
              "], got ", rounds);
  auto check_u32 = [op](const char* name, const at::Tensor& t) {
    if (t.numel() == 0) return;
    const auto [lo, hi] = at::aminmax(t);
    const int64_t l = lo.item<int64_t>(), h = hi.item<int64_t>();
    TORCH_CHECK(l >= 0 && h <= int64_t(0xffffffff), op, ": ", name,
                " must hold uint32 values in [0, 2^32 - 1], got values in [", l, ", ", h, "]");
  };
  check_u32("counter", counter);
  check_u32("key", key);
  return {counter.contiguous(), key.contiguous()};
}

// philox_uniform / philox_normal: a floating dtype the kernels support and a
// non-negative size with fewer than 2^48 elements (see the counter layout in
// philox.h).  The seed and offset are checked by check_random_args (random_state.h).
inline void check_philox_factory(const char* op, at::IntArrayRef size, at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16, op,
              ": dtype must be float16, bfloat16, float32 or float64, got ", dtype);
  for (const int64_t s : size) {
    TORCH_CHECK(s >= 0, op, ": size must be non-negative, got ", size);
  }
  uint64_t numel = 1;
  const bool overflow = c10::safe_multiplies_u64(size, &numel);
  TORCH_CHECK(!overflow && numel < static_cast<uint64_t>(philox::kMaxIndex), op,
              ": size must have fewer than 2^48 elements, got ", size);
}

// The operators of one backend.  Backend: the seed interface (CpuSeeds, CudaSeeds), kDevice,
// and the loops
//   philox4x32(counter, key, rounds, out)     counter, key contiguous, out (n, 4), n > 0
//   fill<scalar_t, Fn>(out, seed)             out[i] = Fn<scalar_t>{seed, offset}(i), numel > 0
template <class Backend>
struct Ops {
  static at::Tensor philox4x32(const at::Tensor& counter_in, const at::Tensor& key_in, int64_t rounds) {
    TORCH_CHECK(counter_in.device().type() == Backend::kDevice, "philox4x32: counter must be a ", Backend::kDevice,
                " tensor here, got ", counter_in.device());
    const auto [counter, key] = check_philox4x32_args(counter_in, key_in, rounds);
    const typename Backend::Guard guard(counter.device());
    at::Tensor out = at::empty({counter.size(0), 4}, counter.options());
    if (counter.size(0) > 0) Backend::philox4x32(counter, key, static_cast<int>(rounds), out);
    return out;
  }

  template <template <typename> class Fn>
  static at::Tensor fill(const char* op, c10::SymIntArrayRef size_in, at::ScalarType dtype, at::Device device,
                         const std::optional<at::Generator>& generator, std::optional<int64_t> seed,
                         std::optional<int64_t> offset) {
    const at::IntArrayRef size = C10_AS_INTARRAYREF_SLOW(size_in);
    check_philox_factory(op, size, dtype);
    const typename Backend::Guard guard(device);
    const auto drawn = Backend::draw(op, generator, seed, offset, 1, device);
    at::Tensor out = at::empty(size, at::TensorOptions().dtype(dtype).device(device));
    if (out.numel() == 0) return out;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "vmfdist_philox_fill", [&] {
      Backend::template fill<scalar_t, Fn>(out, drawn.seed);
    });
    return out;
  }

  static at::Tensor uniform(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                            std::optional<at::Generator> generator, std::optional<int64_t> seed,
                            std::optional<int64_t> offset) {
    return fill<UniformFn>("philox_uniform", size, dtype, device, generator, seed, offset);
  }

  static at::Tensor normal(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                           std::optional<at::Generator> generator, std::optional<int64_t> seed,
                           std::optional<int64_t> offset) {
    return fill<NormalFn>("philox_normal", size, dtype, device, generator, seed, offset);
  }
};

}  // namespace philox
}  // namespace vmfdist
