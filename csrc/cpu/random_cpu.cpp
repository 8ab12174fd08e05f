// CPU kernels for the counter-based random ops: at::parallel_for loops over the
// per-element functors of philox.h (Philox4x32-10).  The operators themselves
// (checks, seed, allocation) are shared with CUDA: philox::Ops in host/philox_host.h.
// Element i depends only on (seed, offset, i), so the result is the same for any
// number of threads and any grain size.
//
// philox_uniform / philox_normal are factory ops (no tensor inputs); the
// BackendSelect kernel in csrc/ops.cpp routes them here when device is a CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "host/philox_host.h"
#include "host/random_state.h"
#include "vmfdist/philox.h"

namespace vmfdist {
namespace {

// A Philox4x32-10 block costs ~10-20 ns: grains of a few thousand elements.
constexpr int64_t kGrain = 4096;

struct CpuRandom : CpuSeeds {
  static constexpr at::DeviceType kDevice = at::kCPU;

  static void philox4x32(const at::Tensor& counter, const at::Tensor& key, int rounds, at::Tensor& out) {
    const int64_t* pc = counter.const_data_ptr<int64_t>();
    const int64_t* pk = key.const_data_ptr<int64_t>();
    int64_t* po = out.mutable_data_ptr<int64_t>();
    at::parallel_for(0, counter.size(0), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) philox::block_row(pc + 4 * i, pk + 2 * i, rounds, po + 4 * i);
    });
  }

  template <class scalar_t, template <typename> class Fn>
  static void fill(at::Tensor& out, const SeedOffset& so) {
    const Fn<scalar_t> fn{so.seed, so.offset};
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, out.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = fn(static_cast<uint64_t>(i));
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("philox4x32", &philox::Ops<CpuRandom>::philox4x32);
  m.impl("philox_uniform", &philox::Ops<CpuRandom>::uniform);
  m.impl("philox_normal", &philox::Ops<CpuRandom>::normal);
}

}  // namespace vmfdist
