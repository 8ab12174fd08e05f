// Standard normals in float precision from Philox4x32-10, fast and bit-identical
// on host and device.
//
// The float32 samplers (the vMF tangent direction, csrc/include/vmfdist/vmf.h)
// need tens of millions of normals per second per core, which libm's double
// log/sin/cos cannot give.  Here Box-Muller is written with branch-free float
// polynomials (own derivations, below) so that
//   * a loop over Philox blocks vectorises (the CPU batch routine normals_f32
//     processes kLanes blocks at a time; its callers run it through
//     isa::dispatch, so it is compiled for AVX2 + FMA and for the baseline ISA,
//     chosen at run time: isa_dispatch.h), and
//   * host and device evaluate the same float operations in the same order
//     (no FMA contraction: -ffp-contract=off / --fmad=false), so a row's normals
//     are the same bits on CPU and GPU.
// Accuracy: log_unit and sincos_2pi are within a few float ulp of the exact
// functions (tests/test_vmf.py checks them against float64 libm); the normals have
// the granularity of 23-bit uniforms, so |z| <= sqrt(2 * 24 ln 2) ~ 5.77.
//
// Word use (part of the reproducibility contract): block j of stream
// (seed, offset, row) gives normals 4j .. 4j+3, from the uniform pairs
// (word 0, word 1) and (word 2, word 3), each word mapped to (2k + 1) / 2^24 with
// k its top 23 bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vmfdist/isa_dispatch.h"
#include "vmfdist/macros.h"
#include "vmfdist/philox.h"

namespace vmfdist {
namespace fast_normal {

VMF_FORCEINLINE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

VMF_FORCEINLINE float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// Uniform on (0, 1): (2k + 1) / 2^24 with k the top 23 bits of the word (exact in float).
VMF_FORCEINLINE float uniform24(uint32_t w) { return static_cast<float>((w >> 9) * 2u + 1u) * 0x1p-24f; }

// log(u) for normal positive u <= 1.  u = m 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s) = 2s (1 + s^2/3 + s^4/5 + s^6/7 + s^8/9 + ...), s = (m-1)/(m+1),
// |s| <= 0.1716, so the first omitted term is below 2e-9 relative.
VMF_FORCEINLINE float log_unit(float u) {
  // Branch-free integer selects (so that loops over lanes vectorise).
  const uint32_t b = float_bits(u);
  uint32_t mb = (b & 0x007fffffu) | 0x3f800000u;          // m in [1, 2)
  const uint32_t big = mb > 0x3fb504f3u ? 1u : 0u;         // m > sqrt(2) (float nearest)
  mb -= big << 23;                                         // m / 2, exactly
  const int32_t e = static_cast<int32_t>(b >> 23) - 127 + static_cast<int32_t>(big);
  const float m = bits_float(mb);
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float p = 1.0f + s2 * (0.333333343f + s2 * (0.200000003f + s2 * (0.142857149f + s2 * 0.111111112f)));
  const float fe = static_cast<float>(e);
  // ln 2 split so that fe * kLn2Hi is exact for |e| < 2^8
  const float kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
  return fe * kLn2Hi + (fe * kLn2Lo + 2.0f * s * p);
}

// sin and cos of 2 pi u for u in (0, 1).  With q = round(4u) and f = u - q/4 in
// [-1/8, 1/8] (exact), x = 2 pi f in [-pi/4, pi/4] and the quadrant q mod 4 rotates
// (sin x, cos x): sin -> (s, c, -s, -c)[q], cos -> (c, -s, -c, s)[q], done with bit
// selects and sign flips.  Taylor polynomials to x^9 and x^10: errors below 2e-9.
VMF_FORCEINLINE void sincos_2pi(float u, float* sn, float* cs) {
  const int32_t qi = static_cast<int32_t>(4.0f * u + 0.5f);
  const float f = u - 0.25f * static_cast<float>(qi);
  const float x = 6.28318548f * f;
  const float x2 = x * x;
  const float s = x * (1.0f + x2 * (-0.166666672f + x2 * (8.33333377e-3f + x2 * (-1.98412701e-4f + x2 * 2.75573188e-6f))));
  const float c =
      1.0f + x2 * (-0.5f + x2 * (4.16666679e-2f + x2 * (-1.38888892e-3f + x2 * (2.48015876e-5f + x2 * -2.75573188e-7f))));
  const uint32_t q = static_cast<uint32_t>(qi) & 3u;
  const uint32_t swap = 0u - (q & 1u);  // all ones for q = 1, 3
  const uint32_t sb = float_bits(s), cb = float_bits(c);
  const uint32_t sin_bits = (sb & ~swap) | (cb & swap);
  const uint32_t cos_bits = (cb & ~swap) | (sb & swap);
  const uint32_t sin_sign = (q & 2u) << 30;           // negate for q = 2, 3
  const uint32_t cos_sign = ((q + 1u) & 2u) << 30;    // negate for q = 1, 2
  *sn = bits_float(sin_bits ^ sin_sign);
  *cs = bits_float(cos_bits ^ cos_sign);
}

// Box-Muller from two words.
VMF_FORCEINLINE void box_muller_f(uint32_t w1, uint32_t w2, float* z0, float* z1) {
  const float r = ::sqrtf(-2.0f * log_unit(uniform24(w1)));
  float sn, cs;
  sincos_2pi(uniform24(w2), &sn, &cs);
  *z0 = r * cs;
  *z1 = r * sn;
}

// Normals 4j .. 4j+3 of stream (seed, offset, row).
VMF_INLINE void normal4_f32(uint64_t seed, uint64_t offset, uint64_t row, uint32_t j, float* z) {
  const philox::U32x4 b = philox::stream_block(seed, offset, row, j);
  box_muller_f(b.v[0], b.v[1], z, z + 1);
  box_muller_f(b.v[2], b.v[3], z + 2, z + 3);
}

// ---- double precision --------------------------------------------------------
// Uniform on (0, 1) from a 32-bit word: (k + 1/2) 2^-32, exact in double.
VMF_INLINE double uniform_u32_f64(uint32_t k) { return (static_cast<double>(k) + 0.5) * 0x1p-32; }

// Normals 4j .. 4j+3 of stream (seed, offset, row) by Box-Muller in double (libm),
// for float64 (and half/bfloat16) outputs: the same words as normal4_f32, finer uniforms.
VMF_INLINE void normal4_f64(uint64_t seed, uint64_t offset, uint64_t row, uint32_t j, double* z) {
  const philox::U32x4 b = philox::stream_block(seed, offset, row, j);
  philox::box_muller(uniform_u32_f64(b.v[0]), uniform_u32_f64(b.v[1]), z, z + 1);
  philox::box_muller(uniform_u32_f64(b.v[2]), uniform_u32_f64(b.v[3]), z + 2, z + 3);
}

// The normals of an output of type scalar_t: float32 uses the float Box-Muller (the
// vectorised CPU routine gives the same bits), every other type the double one.
template <class scalar_t>
VMF_INLINE void normal4_for(uint64_t seed, uint64_t offset, uint64_t row, uint32_t j, double* z) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    float zf[4];
    normal4_f32(seed, offset, row, j, zf);
    for (int k = 0; k < 4; ++k) z[k] = zf[k];
  } else {
    normal4_f64(seed, offset, row, j, z);
  }
}

#if !defined(__CUDACC__)
// ---- CPU batch routine -----------------------------------------------------
// Normals [0, n) of stream (seed, offset, row) into out: the same values as
// normal4_f32, computed kLanes blocks at a time in loops the compiler vectorises.
constexpr int kLanes = 16;

// kLanes Philox blocks side by side: lane l starts from the counter (x0, x1, x2, x3)[l]
// under the key (k0, k1) and leaves its four normals in out[4l .. 4l+3] (the values of
// normal4_f32 for that stream and block).
VMF_FORCEINLINE void philox_lanes_normals(uint32_t* x0, uint32_t* x1, uint32_t* x2, uint32_t* x3, uint32_t k0,
                                          uint32_t k1, float* out) {
  for (int r = 0; r < philox::kDefaultRounds; ++r) {
    const uint32_t rk0 = k0 + static_cast<uint32_t>(r) * philox::kWeyl0;
    const uint32_t rk1 = k1 + static_cast<uint32_t>(r) * philox::kWeyl1;
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(philox::kMul0) * x0[l];
      const uint64_t p1 = static_cast<uint64_t>(philox::kMul1) * x2[l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ x1[l] ^ rk0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ x3[l] ^ rk1;
      x1[l] = static_cast<uint32_t>(p1);
      x3[l] = static_cast<uint32_t>(p0);
      x0[l] = n0;
      x2[l] = n2;
    }
  }
  float z0[kLanes], z1[kLanes], z2[kLanes], z3[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    box_muller_f(x0[l], x1[l], &z0[l], &z1[l]);
    box_muller_f(x2[l], x3[l], &z2[l], &z3[l]);
  }
  for (int l = 0; l < kLanes; ++l) {
    out[4 * l] = z0[l];
    out[4 * l + 1] = z1[l];
    out[4 * l + 2] = z2[l];
    out[4 * l + 3] = z3[l];
  }
}

// Blocks j0 .. j0 + kLanes - 1 of one stream (counter words 1-3 fixed).  A dispatch of
// its own (isa::dispatch, isa_dispatch.h): the lane loops vectorise best compiled by themselves,
// not flattened into a caller's dispatch.
inline void normals_f32_chunk(uint32_t j0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                              float* out) {
  isa::dispatch([&] {
    uint32_t x0[kLanes], x1[kLanes], x2[kLanes], x3[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      x0[l] = j0 + static_cast<uint32_t>(l);
      x1[l] = c1;
      x2[l] = c2;
      x3[l] = c3;
    }
    philox_lanes_normals(x0, x1, x2, x3, k0, k1, out);
  });
}

// Any kLanes counters (blocks of different streams), copied in; likewise dispatched.
inline void normals_f32_lanes(const uint32_t* c0, const uint32_t* c1, const uint32_t* c2, const uint32_t* c3,
                              uint32_t k0, uint32_t k1, float* out) {
  isa::dispatch([&] {
    uint32_t x0[kLanes], x1[kLanes], x2[kLanes], x3[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      x0[l] = c0[l];
      x1[l] = c1[l];
      x2[l] = c2[l];
      x3[l] = c3[l];
    }
    philox_lanes_normals(x0, x1, x2, x3, k0, k1, out);
  });
}

// Normals [0, 4 nb) of the streams (seed, offset, row0 + r), r < nrows, for short rows:
// rows with few blocks each do not fill a chunk of one stream, so the blocks of several
// rows share the vector lanes.  out[4 nb r + i] is normal i of row row0 + r (the values
// of normal4_f32); out must hold 4 nb nrows rounded up to a multiple of 4 kLanes.
inline void normals_f32_rows(uint64_t seed, uint64_t offset, uint64_t row0, int64_t nrows, uint32_t nb, float* out) {
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const int64_t lanes = nrows * static_cast<int64_t>(nb);
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int64_t start = 0; start < lanes; start += kLanes) {
    for (int l = 0; l < kLanes; ++l) {  // lane i: block i % nb of row row0 + i / nb; pad with a repeat
      const int64_t lane = start + l < lanes ? start + l : lanes - 1;
      const philox::U32x4 c =
          philox::stream_counter(offset, row0 + static_cast<uint64_t>(lane / nb), static_cast<uint32_t>(lane % nb));
      c0[l] = c.v[0];
      c1[l] = c.v[1];
      c2[l] = c.v[2];
      c3[l] = c.v[3];
    }
    normals_f32_lanes(c0, c1, c2, c3, k0, k1, out + 4 * start);
  }
}

// Normals [4 j0, 4 j0 + n) of stream (seed, offset, row) into out (float).
inline void normals_f32(uint64_t seed, uint64_t offset, uint64_t row, uint32_t j0, int64_t n, float* out) {
  const philox::U32x4 c = philox::stream_counter(offset, row, 0);
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    normals_f32_chunk(j0 + static_cast<uint32_t>(i >> 2), c.v[1], c.v[2], c.v[3], k0, k1, out + i);
  }
  if (n - i <= 16) {  // a short tail (or a short row, small d): scalar blocks
    for (; i < n; i += 4) {
      float z[4];
      normal4_f32(seed, offset, row, j0 + static_cast<uint32_t>(i >> 2), z);
      for (int64_t k = 0; k < 4 && i + k < n; ++k) out[i + k] = z[k];
    }
  } else if (i < n) {
    float tail[4 * kLanes];
    normals_f32_chunk(j0 + static_cast<uint32_t>(i >> 2), c.v[1], c.v[2], c.v[3], k0, k1, tail);
    for (int64_t k = 0; i + k < n; ++k) out[i + k] = tail[k];
  }
}

// The same for any output type (see normal4_for): float32 through the vectorised
// routine, other types through normal4_f64, rounded once.
template <class scalar_t>
inline void fill_normals(uint64_t seed, uint64_t offset, uint64_t row, uint32_t j0, int64_t n, scalar_t* out) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    normals_f32(seed, offset, row, j0, n, out);
  } else {
    double z[4];
    for (int64_t i = 0; i < n; i += 4) {
      normal4_f64(seed, offset, row, j0 + static_cast<uint32_t>(i >> 2), z);
      for (int64_t k = 0; k < 4 && i + k < n; ++k) out[i + k] = static_cast<scalar_t>(z[k]);
    }
  }
}
#endif  // !__CUDACC__

}  // namespace fast_normal
}  // namespace vmfdist
