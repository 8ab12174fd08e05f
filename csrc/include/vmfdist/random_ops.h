// Per-element functors over philox.h, shared by the CPU loops
// (csrc/cpu/random_cpu.cpp) and the CUDA kernels (csrc/cuda/random_cuda.cu):
// the backends only loop over elements and call these.
#pragma once

#include <cstdint>
#include <limits>

#include "vmfdist/macros.h"
#include "vmfdist/philox.h"

namespace vmfdist {

// Element i of philox_uniform: the first uniform of stream (seed, offset, i) on
// the grid of the output type (P = its significand bits: 53, 24, 11 or 8), so
// it is exact in scalar_t and lies in (0, 1).  float64 uses two words, the
// others one.
template <typename scalar_t>
struct PhiloxUniformFn {
  uint64_t seed, offset;
  VMF_HD scalar_t operator()(uint64_t i) const {
    constexpr int P = std::numeric_limits<scalar_t>::digits;
    static_assert(P >= 2 && P <= 53, "PhiloxUniformFn: unsupported floating type");
    philox::PhiloxStream s(seed, offset, i);
    return static_cast<scalar_t>(s.next_uniform<P>());
  }
};

// Element i of philox_normal: the first normal (z0 of the first Box-Muller pair,
// i.e. of block 0) of stream (seed, offset, i), computed in double and rounded.
template <typename scalar_t>
struct PhiloxNormalFn {
  uint64_t seed, offset;
  VMF_HD scalar_t operator()(uint64_t i) const {
    philox::PhiloxStream s(seed, offset, i);
    return static_cast<scalar_t>(s.next_normal());
  }
};

// One row of the raw philox4x32 op: counter (4 words) and key (2 words) hold
// uint32 values in int64 (checked by the caller); the output block likewise.
VMF_INLINE void philox4x32_row(const int64_t* ctr, const int64_t* key, int rounds, int64_t* out) {
  philox::U32x4 c;
  for (int r = 0; r < 4; ++r) c.v[r] = static_cast<uint32_t>(ctr[r]);
  const philox::U32x4 b =
      philox::block(c, static_cast<uint32_t>(key[0]), static_cast<uint32_t>(key[1]), rounds);
  for (int r = 0; r < 4; ++r) out[r] = static_cast<int64_t>(b.v[r]);
}

}  // namespace vmfdist
