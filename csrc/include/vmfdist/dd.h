// Double-double ("dd") arithmetic: an unevaluated sum hi + lo of two doubles,
// about 106 bits of significand.  Used where a float64 result must be right to
// the last bits although the formula cancels (e.g. nu * log(...) + sqrt(nu^2+z^2)
// near the turning point of the Bessel function, or the log-normaliser of a
// distribution).  Error-free transformations follow Dekker (1971) and Knuth's
// two-sum; they need IEEE round-to-nearest and no contraction of a*b+c into an
// fma behind our back (setup.py passes -ffp-contract=off / --fmad=false).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "vmfdist/macros.h"

namespace vmfdist {

struct DD {
  double hi;
  double lo;
  VMF_HD DD() : hi(0.0), lo(0.0) {}
  VMF_HD DD(double h) : hi(h), lo(0.0) {}  // NOLINT: implicit on purpose
  VMF_HD DD(double h, double l) : hi(h), lo(l) {}
};

namespace dd {

// The IEEE bit pattern of a double and back (exponent tricks without frexp/ldexp calls).
VMF_INLINE uint64_t bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
VMF_INLINE double from_bits(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// 2^-e for the binary exponent e of a normal x > 0 (x in [2^e, 2^(e+1))), so that
// x * pow2_recip(x) lies in [1, 2).  Exact; needs 2^-e normal, i.e. x < 2^1022.
VMF_INLINE double pow2_recip(double x) {
  return from_bits((uint64_t{2046} << 52) - (bits(x) & (uint64_t{0x7ff} << 52)));
}

VMF_INLINE DD two_sum(double a, double b) {
  double s = a + b;
  double bb = s - a;
  double e = (a - (s - bb)) + (b - bb);
  return DD(s, e);
}

// |a| >= |b| (or a == 0)
VMF_INLINE DD quick_two_sum(double a, double b) {
  double s = a + b;
  double e = b - (s - a);
  return DD(s, e);
}

VMF_INLINE DD two_prod(double a, double b) {
  double p = a * b;
  double e = ::fma(a, b, -p);
  return DD(p, e);
}

}  // namespace dd

VMF_INLINE DD operator-(DD a) { return DD(-a.hi, -a.lo); }

VMF_INLINE DD operator+(DD a, DD b) {
  DD s = dd::two_sum(a.hi, b.hi);
  DD t = dd::two_sum(a.lo, b.lo);
  s.lo += t.hi;
  s = dd::quick_two_sum(s.hi, s.lo);
  s.lo += t.lo;
  return dd::quick_two_sum(s.hi, s.lo);
}

VMF_INLINE DD operator+(DD a, double b) {
  DD s = dd::two_sum(a.hi, b);
  s.lo += a.lo;
  return dd::quick_two_sum(s.hi, s.lo);
}
VMF_INLINE DD operator+(double a, DD b) { return b + a; }
VMF_INLINE DD operator-(DD a, DD b) { return a + (-b); }
VMF_INLINE DD operator-(DD a, double b) { return a + (-b); }
VMF_INLINE DD operator-(double a, DD b) { return (-b) + a; }

VMF_INLINE DD operator*(DD a, DD b) {
  DD p = dd::two_prod(a.hi, b.hi);
  p.lo += a.hi * b.lo + a.lo * b.hi;
  return dd::quick_two_sum(p.hi, p.lo);
}

VMF_INLINE DD operator*(DD a, double b) {
  DD p = dd::two_prod(a.hi, b);
  p.lo += a.lo * b;
  return dd::quick_two_sum(p.hi, p.lo);
}
VMF_INLINE DD operator*(double a, DD b) { return b * a; }

VMF_INLINE DD operator/(DD a, DD b) {
  double q1 = a.hi / b.hi;
  DD r = a - b * q1;
  double q2 = r.hi / b.hi;
  r = r - b * q2;
  double q3 = r.hi / b.hi;
  DD q = dd::quick_two_sum(q1, q2);
  return q + q3;
}
VMF_INLINE DD operator/(DD a, double b) { return a / DD(b); }
VMF_INLINE DD operator/(double a, DD b) { return DD(a) / b; }

namespace dd {

VMF_INLINE double to_double(DD a) { return a.hi + a.lo; }
VMF_INLINE double to_double(double a) { return a; }

VMF_INLINE DD ldexp(DD a, int e) { return DD(::ldexp(a.hi, e), ::ldexp(a.lo, e)); }

VMF_INLINE DD sqrt(DD a) {
  if (!(a.hi > 0.0)) return DD(::sqrt(a.hi));
  double x = ::sqrt(a.hi);
  DD r = a - two_prod(x, x);  // Newton: x + (a - x^2) / (2x)
  return quick_two_sum(x, r.hi / (2.0 * x));
}

// Constants as (hi, lo) pairs (checked against mpmath in tests/test_dd.py).
VMF_CONSTANT double kLn2Hi = 0.6931471805599453, kLn2Lo = 2.3190468138462996e-17;
VMF_CONSTANT double kLog2PiHi = 1.8378770664093456, kLog2PiLo = -7.756588316134483e-17;
VMF_CONSTANT double kSqrtHalf = 0.70710678118654757;

// Natural log of a positive double-double, relative error ~1e-29.
// x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(u), u = (m-1)/(m+1),
// |u| <= 0.172, summed as 2u (1 + w/3 + w^2/5 + ...), w = u^2: the first five
// coefficients in double-double, the tail (below 2^-27 relative) in double.
VMF_INLINE DD log(DD x) {
  int e;
  ::frexp(x.hi, &e);
  DD m = ldexp(x, -e);  // [0.5, 1)
  if (m.hi < kSqrtHalf) {
    m = m * 2.0;
    e -= 1;
  }
  DD u = (m - 1.0) / (m + 1.0);
  DD w = u * u;
  double wh = w.hi;
  double tail = 1.0 / 41.0;
  for (int k = 19; k >= 5; --k) tail = tail * wh + 1.0 / (2 * k + 1);
  // S = 1 + w/3 + w^2/5 + w^3/7 + w^4/9 + w^5 * tail
  DD s = DD(0.1111111111111111, 6.1679056923619804e-18) + w * tail;
  s = DD(0.14285714285714285, 7.93016446160826e-18) + w * s;
  s = DD(0.2, -1.1102230246251566e-17) + w * s;
  s = DD(0.3333333333333333, 1.850371707708594e-17) + w * s;
  s = 1.0 + w * s;
  DD ln2e = two_prod(static_cast<double>(e), kLn2Hi) + static_cast<double>(e) * kLn2Lo;
  return ln2e + (u * s) * 2.0;
}
VMF_INLINE DD log(double x) { return log(DD(x)); }

}  // namespace dd
}  // namespace vmfdist
