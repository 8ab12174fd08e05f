// Host-device math of the Kronecker-eigenbasis ops (kron_eigen_matvec,
// kron_eigen_noise, kron_eigen_sample): the elementwise pass between the matrix
// products, written once for the CPU loops (csrc/cpu/kron_cpu.cpp) and the CUDA
// kernels (csrc/cuda/kron_cuda.cu).  The matrix products themselves are ATen
// calls (csrc/host/kron_host.h).
//
//   kron_eigen_matvec:  T <- T * s^p           (T = Q_out^T V Q_in, in place)
//   kron_eigen_noise:   Z <- E * s^p           (E standard normal, drawn here)
//
// s^p is evaluated once per element, in the "op math" type (float for float32,
// half and bfloat16; double for float64), and the powers the callers use
// (1, 1/2, -1/2, -1, 2, 0) avoid pow().
//
// Noise layout (part of the reproducibility contract): the noise tensor of size
// (..., out, in) is a stack of rows of length `in`; row r (row-major index over
// all dimensions but the last) is the Philox stream (seed, offset, r), and its
// entry j is normal j of that stream:
//   float32:          fast_normal::normal4_f32 (float Box-Muller), block j / 4, lane j % 4
//   other dtypes:     fast_normal::normal4_f64 (double Box-Muller), block j / 4, lane j % 4,
//                     rounded once to the dtype
// so the values do not depend on the thread count or the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vmfdist/fast_normal.h"
#include "vmfdist/macros.h"

namespace vmfdist {
namespace kron {

// ---- s^p ---------------------------------------------------------------------

enum class PowMode : int { kOne = 0, kZero, kSqrt, kRsqrt, kRecip, kSquare, kGeneral };

// Chosen on the host from the op's `power` argument.
inline PowMode pow_mode(double p) {
  if (p == 1.0) return PowMode::kOne;
  if (p == 0.0) return PowMode::kZero;
  if (p == 0.5) return PowMode::kSqrt;
  if (p == -0.5) return PowMode::kRsqrt;
  if (p == -1.0) return PowMode::kRecip;
  if (p == 2.0) return PowMode::kSquare;
  return PowMode::kGeneral;
}

// sqrt and pow of the op-math type (float or double) on host and device.
template <typename T>
VMF_FORCEINLINE T kron_sqrt(T x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

template <typename T>
VMF_FORCEINLINE T kron_pow(T x, T p) {
#if defined(__CUDA_ARCH__)
  return ::pow(x, p);
#else
  return std::pow(x, p);
#endif
}

// s^p for the mode M (p is only read by kGeneral).  0^0 = 1 as in pow().
template <PowMode M, typename T>
VMF_FORCEINLINE T spow(T s, T p) {
  if constexpr (M == PowMode::kOne) {
    return s;
  } else if constexpr (M == PowMode::kZero) {
    return T(1);
  } else if constexpr (M == PowMode::kSqrt) {
    return kron_sqrt(s);
  } else if constexpr (M == PowMode::kRsqrt) {
    return T(1) / kron_sqrt(s);
  } else if constexpr (M == PowMode::kRecip) {
    return T(1) / s;
  } else if constexpr (M == PowMode::kSquare) {
    return s * s;
  } else {
    return kron_pow(s, p);
  }
}

// Calls f.template operator()<M>() for the runtime mode: one instantiation of a
// loop per mode, so inner loops have no branch on the mode.
template <class F>
inline void dispatch_pow_mode(PowMode m, F&& f) {
  switch (m) {
    case PowMode::kOne: f.template operator()<PowMode::kOne>(); break;
    case PowMode::kZero: f.template operator()<PowMode::kZero>(); break;
    case PowMode::kSqrt: f.template operator()<PowMode::kSqrt>(); break;
    case PowMode::kRsqrt: f.template operator()<PowMode::kRsqrt>(); break;
    case PowMode::kRecip: f.template operator()<PowMode::kRecip>(); break;
    case PowMode::kSquare: f.template operator()<PowMode::kSquare>(); break;
    default: f.template operator()<PowMode::kGeneral>(); break;
  }
}

// ---- broadcast offsets ---------------------------------------------------------

// Offset of batch entry b (row-major linear index over the output's batch shape)
// in a broadcast operand: the operand's strides over the batch dimensions (0 for a
// broadcast dimension), coalesced on the host (kron_host.h) to at most kMaxDims.
constexpr int kMaxDims = 8;

struct BatchOffsets {
  int ndim = 0;                // 0: every batch entry has offset 0
  int64_t size[kMaxDims] = {};   // innermost dimension last
  int64_t stride[kMaxDims] = {};

  VMF_HD int64_t operator()(int64_t b) const {
    int64_t off = 0;
    for (int k = ndim - 1; k >= 0; --k) {
      const int64_t q = b / size[k];
      off += (b - q * size[k]) * stride[k];
      b = q;
    }
    return off;
  }
};

// ---- the elementwise pass of kron_eigen_matvec ----------------------------------

// t[k] *= s[k]^p for k in [0, n): one contiguous stretch of the output
// (inside one batch entry), s the matching stretch of the scale.
template <PowMode M, typename scalar_t, typename opmath_t>
VMF_FORCEINLINE void scale_mul_stretch(scalar_t* t, const scalar_t* s, int64_t n, opmath_t p) {
  for (int64_t k = 0; k < n; ++k) {
    t[k] = static_cast<scalar_t>(static_cast<opmath_t>(t[k]) * spow<M>(static_cast<opmath_t>(s[k]), p));
  }
}

// ---- the noise ---------------------------------------------------------------

// Normals 4j .. 4j+3 of row r of the noise (see the layout above), as op-math values.
template <typename scalar_t, typename opmath_t>
VMF_FORCEINLINE void noise4(uint64_t seed, uint64_t offset, uint64_t row, uint32_t j, opmath_t* z) {
  double zd[4];
  fast_normal::normal4_for<scalar_t>(seed, offset, row, j, zd);
  // rounded to the dtype first, so every dtype's E is its own rounding of its normal
  for (int k = 0; k < 4; ++k) z[k] = static_cast<opmath_t>(static_cast<scalar_t>(zd[k]));
}

}  // namespace kron
}  // namespace vmfdist
