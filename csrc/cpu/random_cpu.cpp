// CPU kernels for the counter-based random ops: at::parallel_for loops over the
// per-element functors in vmfdist/random_ops.h (Philox4x32-10, philox.h).
// Element i depends only on (seed, offset, i), so the result is the same for any
// number of threads and any grain size.
//
// philox_uniform / philox_normal are factory ops (no tensor inputs); the
// BackendSelect kernel in csrc/ops.cpp routes them here when device is a CPU.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>

#include "host/random_checks.h"
#include "host/random_state.h"
#include "vmfdist/random_ops.h"

namespace vmfdist {
namespace {

// A Philox4x32-10 block costs ~10-20 ns: grains of a few thousand elements.
constexpr int64_t kGrain = 4096;

at::Tensor philox4x32_cpu(const at::Tensor& counter_in, const at::Tensor& key_in, int64_t rounds) {
  TORCH_CHECK(counter_in.device().is_cpu(), "philox4x32: counter must be a CPU tensor here, got ",
              counter_in.device());
  const auto [counter, key] = check_philox4x32_args(counter_in, key_in, rounds);
  const int64_t n = counter.size(0);
  at::Tensor out = at::empty({n, 4}, counter.options());
  const int64_t* pc = counter.const_data_ptr<int64_t>();
  const int64_t* pk = key.const_data_ptr<int64_t>();
  int64_t* po = out.mutable_data_ptr<int64_t>();
  const int r = static_cast<int>(rounds);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) philox4x32_row(pc + 4 * i, pk + 2 * i, r, po + 4 * i);
  });
  return out;
}

template <template <typename> class Fn>
at::Tensor philox_fill_cpu(const char* op, c10::SymIntArrayRef size_in, at::ScalarType dtype, at::Device device,
                           const std::optional<at::Generator>& generator, std::optional<int64_t> seed,
                           std::optional<int64_t> offset) {
  const at::IntArrayRef size = C10_AS_INTARRAYREF_SLOW(size_in);
  check_philox_factory(op, size, dtype);
  const SeedOffset so = cpu_seed_offset(op, generator, seed, offset, 1);
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(dtype).device(device));
  const int64_t n = out.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "vmfdist_philox_fill", [&] {
    const Fn<scalar_t> fn{so.seed, so.offset};
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = fn(static_cast<uint64_t>(i));
    });
  });
  return out;
}

at::Tensor philox_uniform_cpu(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                              std::optional<at::Generator> generator, std::optional<int64_t> seed,
                              std::optional<int64_t> offset) {
  return philox_fill_cpu<PhiloxUniformFn>("philox_uniform", size, dtype, device, generator, seed, offset);
}

at::Tensor philox_normal_cpu(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                             std::optional<at::Generator> generator, std::optional<int64_t> seed,
                             std::optional<int64_t> offset) {
  return philox_fill_cpu<PhiloxNormalFn>("philox_normal", size, dtype, device, generator, seed, offset);
}

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("philox4x32", &philox4x32_cpu);
  m.impl("philox_uniform", &philox_uniform_cpu);
  m.impl("philox_normal", &philox_normal_cpu);
}

}  // namespace vmfdist
