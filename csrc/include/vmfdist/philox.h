// Counter-based random numbers: Philox4x32-10 and the conversions built on it.
//
// Reference: J. K. Salmon, M. A. Moraes, R. O. Dror and D. E. Shaw, "Parallel
// random numbers: as easy as 1, 2, 3", SC'11 (the Random123 library).  The block
// function below is written from the paper's definition; tests/test_philox.py
// checks it against Random123's known-answer vectors.
//
// Everything here is host-device (VMF_HD) and uses only <cstdint>/<cmath>, so the
// CPU loops (csrc/cpu/random_cpu.cpp) and the CUDA kernels
// (csrc/cuda/random_cuda.cu) produce bit-identical raw words and uniforms.
//
// ---------------------------------------------------------------------------
// How vmfdist turns (seed, offset, index) into Philox inputs
// ---------------------------------------------------------------------------
// Every random op takes an int64 `seed` and an int64 `offset` (drawn in Python
// from a torch.Generator, see vmfdist/random.py) and gives each output element
// its own *stream*, identified by the element's linear index `index` (row-major
// position in the output, or whatever the op documents).  The stream is an
// unbounded sequence of 32-bit words w_0, w_1, w_2, ...; word 4*j + r is word r
// of the Philox4x32-10 block
//
//     key     = ( seed        & 0xffffffff,            // key[0]
//                 seed >> 32               )           // key[1]   (seed as uint64)
//     counter = ( j,                                   // ctr[0]: block number in the stream
//                 index       & 0xffffffff,            // ctr[1]: index bits 0..31
//                 (index >> 32) | (offset >> 32) << 16,// ctr[2]: index bits 32..47 | offset bits 32..47 << 16
//                 offset      & 0xffffffff )           // ctr[3]: offset bits 0..31
//
// with 0 <= index < 2^48, 0 <= offset < 2^48 and 0 <= j < 2^32 (so a stream has
// 2^34 words).  The map (seed, offset, index, j) -> (key, counter) is injective
// on that domain, so distinct (seed, offset, index) never share a block.  The
// ops check the ranges of `offset` and of the element count.
//
// Because an element's variates depend only on (seed, offset, index), results do
// not depend on the thread count, the launch configuration or the device.
//
// ---------------------------------------------------------------------------
// Uniform and normal variates
// ---------------------------------------------------------------------------
// uniform_open_u32<P> / uniform_open_u64<P> map random bits to the grid {(2k + 1) / 2^P : 0 <= k < 2^(P-1)},
// the midpoints of 2^(P-1) equal cells of [0, 1].  Every grid point is exactly
// representable in a floating type with a P-bit significand, so the variate is
// never 0 and never 1 (min 2^-P, max 1 - 2^-P) and the distribution is symmetric
// under u -> 1 - u.  P = 24 (float32), 11 (float16) and 8 (bfloat16) use one
// 32-bit word (its top P - 1 bits); P = 53 (float64) uses one 64-bit value made
// of two words (its top 52 bits).  uniform_from_u32 / uniform_from_u64 are the
// float32 / float64 cases.
//
// Normals use the Box-Muller transform in double precision on two float64
// uniforms (four words, i.e. one whole block when the stream is aligned):
//     r = sqrt(-2 log u1),  z0 = r cos(2 pi u2),  z1 = r sin(2 pi u2).
// Since u1 >= 2^-53, |z| <= sqrt(106 log 2) ~ 8.57 (a tail of probability
// ~1e-17 is cut).  Lower-precision outputs are the double value rounded once.
// The raw words and uniforms are bit-identical on CPU and GPU; normals go through
// log/cos/sin, whose last bit may differ between the host libm and CUDA.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "vmfdist/macros.h"

namespace vmfdist {
namespace philox {

// Multipliers and Weyl key increments of Philox4x32 (Salmon et al. 2011, sec. 5).
VMF_CONSTANT uint32_t kMul0 = 0xD2511F53u;
VMF_CONSTANT uint32_t kMul1 = 0xCD9E8D57u;
VMF_CONSTANT uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
VMF_CONSTANT uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kDefaultRounds = 10;
constexpr int kMaxRounds = 16;  // the range Random123 supports

// Ranges of the stream coordinates (see the mapping above).
constexpr int64_t kMaxIndex = int64_t(1) << 48;   // index < kMaxIndex
constexpr int64_t kMaxOffset = int64_t(1) << 48;  // offset < kMaxOffset

struct U32x4 {
  uint32_t v[4];
};

// High and low 32 bits of the 64-bit product a * b.
VMF_INLINE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// One Philox4x32 round: the high halves of M0*c0 and M1*c2 are XORed with c1, c3
// and the round key; with the low halves they form the permuted output block.
VMF_INLINE U32x4 one_round(const U32x4& c, uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mul_hi_lo(kMul0, c.v[0], &hi0, &lo0);
  mul_hi_lo(kMul1, c.v[2], &hi1, &lo1);
  U32x4 out;
  out.v[0] = hi1 ^ c.v[1] ^ k0;
  out.v[1] = lo1;
  out.v[2] = hi0 ^ c.v[3] ^ k1;
  out.v[3] = lo0;
  return out;
}

// The Philox4x32-R block function: `rounds` rounds, the key advanced by the Weyl
// increments before every round but the first.  rounds = 10 is Philox4x32-10.
VMF_INLINE U32x4 block(U32x4 ctr, uint32_t k0, uint32_t k1, int rounds = kDefaultRounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    ctr = one_round(ctr, k0, k1);
  }
  return ctr;
}

// Counter of block j of the stream (seed, offset, index); see the header comment.
VMF_INLINE U32x4 stream_counter(uint64_t offset, uint64_t index, uint32_t j) {
  U32x4 c;
  c.v[0] = j;
  c.v[1] = static_cast<uint32_t>(index);
  c.v[2] = static_cast<uint32_t>((index >> 32) & 0xffffu) | (static_cast<uint32_t>((offset >> 32) & 0xffffu) << 16);
  c.v[3] = static_cast<uint32_t>(offset);
  return c;
}

// ---- uniforms on (0, 1) ----------------------------------------------------

// (2k + 1) / 2^P with k the top P - 1 bits of a 32-bit word; 2 <= P <= 24.
template <int P>
VMF_INLINE double uniform_open_u32(uint32_t bits) {
  static_assert(P >= 2 && P <= 24, "uniform_open_u32: P must be in [2, 24]");
  const uint32_t k = bits >> (33 - P);
  return static_cast<double>(2u * k + 1u) * (1.0 / static_cast<double>(1u << P));
}

// (2k + 1) / 2^P with k the top P - 1 bits of a 64-bit value; 2 <= P <= 53.
template <int P>
VMF_INLINE double uniform_open_u64(uint64_t bits) {
  static_assert(P >= 2 && P <= 53, "uniform_open_u64: P must be in [2, 53]");
  const uint64_t k = bits >> (65 - P);
  return static_cast<double>(2u * k + 1u) * (1.0 / static_cast<double>(uint64_t(1) << P));
}

// float32 uniform in (0, 1) from one word: odd multiples of 2^-24, exact in float.
VMF_INLINE float uniform_from_u32(uint32_t bits) { return static_cast<float>(uniform_open_u32<24>(bits)); }

// float64 uniform in (0, 1) from 64 bits: odd multiples of 2^-53, exact in double.
VMF_INLINE double uniform_from_u64(uint64_t bits) { return uniform_open_u64<53>(bits); }

// ---- standard normals ------------------------------------------------------

// Box-Muller: two independent N(0, 1) from two uniforms on (0, 1).
VMF_INLINE void box_muller(double u1, double u2, double* z0, double* z1) {
  const double two_pi = 6.283185307179586476925286766559;
  const double r = ::sqrt(-2.0 * ::log(u1));
  const double theta = two_pi * u2;
  *z0 = r * ::cos(theta);
  *z1 = r * ::sin(theta);
}

// ---- per-element streams ---------------------------------------------------

// The word stream of one element: PhiloxStream s(seed, offset, index); then
// s.next_u32(), s.next_uniform<P>(), s.next_normal() ... draw successive
// variates.  Word consumption (part of the reproducibility contract):
//   next_u32          1 word
//   next_u64          2 words, the first is the low half
//   next_uniform<P>   1 word for P <= 24, else 2 words (next_u64)
//   next_normal_pair  4 words: u1 = uniform_from_u64(next_u64()), then u2 likewise
//   next_normal       a new pair's z0, and that pair's z1 on the following call
//                     (the cached z1 is dropped by any other draw in between)
// A stream that is not advanced past 2^32 blocks never repeats a word.
class PhiloxStream {
 public:
  VMF_HD PhiloxStream(uint64_t seed, uint64_t offset, uint64_t index)
      : offset_(offset), index_(index), k0_(static_cast<uint32_t>(seed)), k1_(static_cast<uint32_t>(seed >> 32)) {}

  VMF_HD uint32_t next_u32() {
    has_spare_ = false;
    if (pos_ == 4) {
      buf_ = block(stream_counter(offset_, index_, j_), k0_, k1_);
      ++j_;
      pos_ = 0;
    }
    return buf_.v[pos_++];
  }

  VMF_HD uint64_t next_u64() {
    const uint64_t lo = next_u32();
    const uint64_t hi = next_u32();
    return lo | (hi << 32);
  }

  // Uniform on (0, 1) on the P-bit grid (see uniform_open_u32/u64), as a double
  // that is exactly representable with a P-bit significand.
  template <int P = 53>
  VMF_HD double next_uniform() {
    if constexpr (P <= 24) {
      return uniform_open_u32<P>(next_u32());
    } else {
      return uniform_open_u64<P>(next_u64());
    }
  }

  VMF_HD void next_normal_pair(double* z0, double* z1) {
    const double u1 = uniform_from_u64(next_u64());
    const double u2 = uniform_from_u64(next_u64());
    box_muller(u1, u2, z0, z1);
  }

  VMF_HD double next_normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double z0, z1;
    next_normal_pair(&z0, &z1);
    spare_ = z1;
    has_spare_ = true;
    return z0;
  }

  // Number of 32-bit words drawn so far.
  VMF_HD uint64_t words_used() const { return (j_ == 0 ? 0 : 4 * (static_cast<uint64_t>(j_) - 1) + pos_); }

 private:
  uint64_t offset_, index_;
  uint32_t k0_, k1_;
  uint32_t j_ = 0;  // next block to compute
  int pos_ = 4;     // next word of buf_ (4: buffer empty)
  U32x4 buf_ = {{0u, 0u, 0u, 0u}};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Convenience: the four words of block j of stream (seed, offset, index).
VMF_INLINE U32x4 stream_block(uint64_t seed, uint64_t offset, uint64_t index, uint32_t j = 0) {
  return block(stream_counter(offset, index, j), static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Convenience: the first normal pair of stream (seed, offset, index), i.e. the
// Box-Muller transform of block 0 (what philox_normal uses for element `index`).
VMF_INLINE void philox_normal2(uint64_t seed, uint64_t offset, uint64_t index, double* z0, double* z1) {
  PhiloxStream s(seed, offset, index);
  s.next_normal_pair(z0, z1);
}

// ---- the elementwise random ops ---------------------------------------------
// Per-element functors of philox_uniform / philox_normal / philox4x32, called by the
// CPU loops and the CUDA kernels alike (csrc/cpu/random_cpu.cpp, csrc/cuda/random_cuda.cu).

// Element i of philox_uniform: the first uniform of stream (seed, offset, i) on the
// grid of the output type (P = its significand bits: 53, 24, 11 or 8), so it is exact
// in scalar_t and lies in (0, 1).  float64 uses two words, the others one.
template <typename scalar_t>
struct UniformFn {
  uint64_t seed, offset;
  VMF_HD scalar_t operator()(uint64_t i) const {
    constexpr int P = std::numeric_limits<scalar_t>::digits;
    static_assert(P >= 2 && P <= 53, "philox::UniformFn: unsupported floating type");
    PhiloxStream s(seed, offset, i);
    return static_cast<scalar_t>(s.next_uniform<P>());
  }
};

// Element i of philox_normal: the first normal (z0 of the first Box-Muller pair, i.e.
// of block 0) of stream (seed, offset, i), computed in double and rounded.
template <typename scalar_t>
struct NormalFn {
  uint64_t seed, offset;
  VMF_HD scalar_t operator()(uint64_t i) const {
    PhiloxStream s(seed, offset, i);
    return static_cast<scalar_t>(s.next_normal());
  }
};

// One row of the raw philox4x32 op: counter (4 words) and key (2 words) hold uint32
// values in int64 (checked by the caller); the output block likewise.
VMF_INLINE void block_row(const int64_t* ctr, const int64_t* key, int rounds, int64_t* out) {
  U32x4 c;
  for (int r = 0; r < 4; ++r) c.v[r] = static_cast<uint32_t>(ctr[r]);
  const U32x4 b = block(c, static_cast<uint32_t>(key[0]), static_cast<uint32_t>(key[1]), rounds);
  for (int r = 0; r < 4; ++r) out[r] = static_cast<int64_t>(b.v[r]);
}

}  // namespace philox
}  // namespace vmfdist
