// Host-side argument checks shared by the CPU and CUDA random kernels
// (torch headers; not for device code).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/safe_numerics.h>

#include <utility>

#include "vmfdist/philox.h"

namespace vmfdist {

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

}  // namespace vmfdist
