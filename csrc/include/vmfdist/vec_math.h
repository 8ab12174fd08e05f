// Branch-free double exp, expm1 and log1p for the power spherical quadrature's node loop
// (power_spherical.h: dt_dkappa_d): plain arithmetic and integer bit operations, so that a loop
// over nodes vectorises on the CPU, where libm's scalar calls do not.  On the GPU they are
// CUDA's own functions.  Accuracy against glibc's libm over 4e6 random arguments each: exp 1 ulp,
// expm1 2 ulp, log1p 4 ulp (the quadrature's own bound against mpmath is tested in
// tests/test_power_spherical.py).  Domain: |x| <= 700 for exp and expm1 (clamped there; the
// quadrature stays within |x| <= 200), z > -1 with 1 + z normal for log1p.  The polynomials are
// evaluated with std::fma: one instruction in isa::dispatch's AVX2 + FMA copy (a quarter faster
// than a multiply and an add, whose latencies bound the node loop), a correctly rounded libm call
// in the baseline copy, so both copies give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "vmfdist/dd.h"
#include "vmfdist/macros.h"

// Marks a loop whose iterations are independent for the CPU build to vectorise (OpenMP simd: the
// extension is compiled with -fopenmp); nothing under nvcc.
#if defined(__CUDACC__) || !defined(_OPENMP)
#define VMF_SIMD_LOOP
#else
#define VMF_SIMD_LOOP _Pragma("omp simd")
#endif

namespace vmfdist {
namespace vecmath {

#if !defined(__CUDA_ARCH__)
using dd::bits;
using dd::from_bits;

// c ? a : b through bit masks: GCC's vectoriser gives up on a loop whose ternaries it does not
// if-convert ("control flow in loop"), which these sequences of ternaries were.
VMF_FORCEINLINE double select(bool c, double a, double b) {
  const uint64_t m = -static_cast<uint64_t>(c);
  return from_bits((bits(a) & m) | (bits(b) & ~m));
}

// 2^n for an integer n in [-1022, 1023].
VMF_FORCEINLINE double pow2(int64_t n) { return from_bits(static_cast<uint64_t>(n + 1023) << 52); }

// e^r - 1 for |r| <= 0.35 from its Taylor polynomial to r^13 (remainder below 2e-17 relative).
VMF_FORCEINLINE double expm1_reduced(double r) {
  double p = 1.0 / 6227020800.0;
  p = std::fma(p, r, 1.0 / 479001600.0);
  p = std::fma(p, r, 1.0 / 39916800.0);
  p = std::fma(p, r, 1.0 / 3628800.0);
  p = std::fma(p, r, 1.0 / 362880.0);
  p = std::fma(p, r, 1.0 / 40320.0);
  p = std::fma(p, r, 1.0 / 5040.0);
  p = std::fma(p, r, 1.0 / 720.0);
  p = std::fma(p, r, 1.0 / 120.0);
  p = std::fma(p, r, 1.0 / 24.0);
  p = std::fma(p, r, 1.0 / 6.0);
  p = std::fma(p, r, 0.5);
  return r + (r * r) * p;
}

// x = n ln 2 + r with n = round(x / ln 2) (x clamped to [-700, 700]) and |r| <= ln2/2 plus a
// rounding; ln 2 split (fdlibm's ln2_hi has 32 significant bits: n ln2_hi is exact).
struct Reduced {
  double r;
  int64_t n;
};
VMF_FORCEINLINE Reduced reduce(double x) {
  x = select(x < -700.0, -700.0, x);
  x = select(x > 700.0, 700.0, x);
  const double kShift = 6755399441055744.0;  // 1.5 * 2^52: t's low mantissa bits hold n
  const double t = x * 1.4426950408889634 + kShift;
  const double nf = t - kShift;
  const double r = (x - nf * 6.93147180369123816490e-01) - nf * 1.90821492927058770002e-10;
  return {r, static_cast<int64_t>(bits(t) - bits(kShift))};
}

VMF_FORCEINLINE double exp(double x) {
  const Reduced q = reduce(x);
  return (1.0 + expm1_reduced(q.r)) * pow2(q.n);
}

// 2^n (e^r - 1) + (2^n - 1): relative to rounding for every n (no cancellation: for n < 0 the
// result lies in (-1, -0.29), for n > 0 both terms are positive).
VMF_FORCEINLINE double expm1(double x) {
  const Reduced q = reduce(x);
  const double p = pow2(q.n);
  return p * expm1_reduced(q.r) + (p - 1.0);
}

// log u for a positive normal u: u = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s),
// s = (m - 1)/(m + 1), |s| <= 0.1716, by its odd series to s^23 (remainder below 1e-17).
VMF_FORCEINLINE double log_normal(double u) {
  const uint64_t b = bits(u);
  uint64_t mb = (b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;  // m in [1, 2)
  const uint64_t big = static_cast<uint64_t>(mb > 0x3ff6a09e667f3bccULL);  // m > sqrt(2)
  mb -= big << 52;                                                       // m / 2, exactly
  // the exponent as a double without an int64 -> double conversion (AVX2 has none): the biased
  // exponent (plus big) in the low mantissa bits of 2^52, less 2^52
  const double e = (from_bits(0x4330000000000000ULL | ((b >> 52) + big)) - 4503599627370496.0) - 1023.0;
  const double m = from_bits(mb);
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 23.0;
  p = std::fma(p, s2, 1.0 / 21.0);
  p = std::fma(p, s2, 1.0 / 19.0);
  p = std::fma(p, s2, 1.0 / 17.0);
  p = std::fma(p, s2, 1.0 / 15.0);
  p = std::fma(p, s2, 1.0 / 13.0);
  p = std::fma(p, s2, 1.0 / 11.0);
  p = std::fma(p, s2, 1.0 / 9.0);
  p = std::fma(p, s2, 1.0 / 7.0);
  p = std::fma(p, s2, 1.0 / 5.0);
  p = std::fma(p, s2, 1.0 / 3.0);
  const double logm = 2.0 * s + (2.0 * s) * (s2 * p);
  return e * 6.93147180369123816490e-01 + (logm + e * 1.90821492927058770002e-10);
}

// log(1 + z) for z > -1 with 1 + z normal: log(u) z / (u - 1) for u = 1 + z rounded (the
// classical first-order correction of u's rounding; u - 1 is exact), z itself where u is 1.
VMF_FORCEINLINE double log1p(double z) {
  const double u = 1.0 + z;
  const double d = u - 1.0;
  const bool tiny = d == 0.0;
  const double l = log_normal(select(tiny, 1.0, u)) * (z / select(tiny, 1.0, d));
  return select(tiny, z, l);
}
#else
VMF_FORCEINLINE double exp(double x) { return ::exp(x); }
VMF_FORCEINLINE double expm1(double x) { return ::expm1(x); }
VMF_FORCEINLINE double log1p(double z) { return ::log1p(z); }
#endif

}  // namespace vecmath
}  // namespace vmfdist
