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

#include "vmfdist/dd_log_table.h"
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

namespace dd {
// a / b with one division: q1 = a.hi / b (via the reciprocal), one correction from the
// exact remainder a - q1 b.  Relative error about 2^-104 (q1 is within 2 ulp, and the
// correction q2 = (a - q1 b) / b, itself within 2 ulp, is 2^-51 of q1 at most).
VMF_INLINE DD div(DD a, DD b) {
  const double inv = 1.0 / b.hi;
  const double q1 = a.hi * inv;
  DD p = two_prod(q1, b.hi);
  p.lo = ::fma(q1, b.lo, p.lo);                          // q1 b, to ~2^-106 |a|
  const double r = ((a.hi - p.hi) - p.lo) + a.lo;        // a.hi - p.hi is exact (Sterbenz)
  return quick_two_sum(q1, r * inv);
}
VMF_INLINE DD div(DD a, double b) { return div(a, DD(b)); }
}  // namespace dd
VMF_INLINE DD operator/(double a, DD b) { return DD(a) / b; }

namespace dd {

VMF_INLINE double to_double(DD a) { return a.hi + a.lo; }
VMF_INLINE double to_double(double a) { return a; }

VMF_INLINE DD ldexp(DD a, int e) { return DD(::ldexp(a.hi, e), ::ldexp(a.lo, e)); }

// sqrt of a > 0 (a.hi normal), branch-free so that loops over it vectorise.
VMF_INLINE DD sqrt_positive(DD a) {
  double x = ::sqrt(a.hi);
  DD r = a - two_prod(x, x);  // Newton: x + (a - x^2) / (2x)
  return quick_two_sum(x, r.hi / (2.0 * x));
}

VMF_INLINE DD sqrt(DD a) {
  if (!(a.hi > 0.0)) return DD(::sqrt(a.hi));
  double x = ::sqrt(a.hi);
  DD r = a - two_prod(x, x);  // Newton: x + (a - x^2) / (2x)
  return quick_two_sum(x, r.hi / (2.0 * x));
}

// Constants as (hi, lo) pairs (checked against mpmath in tests/test_dd.py).
VMF_CONSTANT double kLn2Hi = 0.6931471805599453, kLn2Lo = 2.3190468138462996e-17;
VMF_CONSTANT double kLog2PiHi = 1.8378770664093456, kLog2PiLo = -7.756588316134483e-17;

VMF_CONSTANT double kThirdHi = 0.3333333333333333, kThirdLo = 1.850371707708594e-17;

// Natural log of a positive double-double.  Error below 2^-90 absolute plus 2^-104
// relative (the table and the first three Taylor terms are carried in double-double,
// the rest of the series, below 2^-38, in double).
// x = 2^e m, m in [1, 2); c_j = 1 + j/256 is the nearest table node (dd_log_table.h) and
// r = m inv_j - 1, |r| <= 2^-9, is formed exactly (fma product, Sterbenz subtraction):
//   log x = e log 2 + T_j + log1p(r),   T_j = -log(inv_j),
//   log1p(r) = r - r^2/2 + r^3/3 + r^4 (-1/4 + r/5 - ... - r^6/10)   (next term < 2^-99).
// r^2 and r^3 are exact products (two_prod); log1p(r_hi + r_lo) takes the low part of r
// through the derivative 1/(1 + r_hi) = 1 - r_hi + r_hi^2 + O(2^-27).  The large pieces
// are summed with error-free quick_two_sums (largest first; their ordering holds for
// every j, see scripts/gen_dd_log_table.py), the low-order remainders in plain double.
// x = 1 gives 0 exactly, and x just below 1 (e = -1, node 256) has e log 2 and T_256 =
// log 2 cancel exactly, so results near 0 keep their relative accuracy.  No divisions,
// no frexp/ldexp: about 60 floating-point operations.
VMF_INLINE DD log(DD x) {
  double xh = x.hi, xl = x.lo;
  int e = 0;
  if (!(xh >= 0x1p-1000 && xh <= 0x1p1000)) {  // subnormal, huge or not a positive number
    if (!(xh > 0.0) || xh == static_cast<double>(INFINITY)) return DD(::log(xh));  // -inf, NaN, inf
    const double s = xh < 1.0 ? 0x1p600 : 0x1p-600;  // exact rescaling
    e = xh < 1.0 ? -600 : 600;
    xh *= s;
    xl *= s;
  }
  const uint64_t b = bits(xh);
  const uint64_t mant = b & ((uint64_t{1} << 52) - 1);
  e += static_cast<int>(b >> 52) - 1023;
  const double m = from_bits(mant | (uint64_t{1023} << 52));  // xh 2^-e, in [1, 2)
  const double ml = xl * pow2_recip(xh);                       // xl 2^-e
  const int j = static_cast<int>((mant + (uint64_t{1} << (51 - kLogTableBits))) >> (52 - kLogTableBits));
  const double inv = kLogInv[j];
  // r = m inv - 1 + ml inv, as rh + rl
  DD p = two_prod(m, inv);
  DD r = quick_two_sum(p.hi - 1.0, ::fma(ml, inv, p.lo));
  const double rh = r.hi, rl = r.lo;
  DD q = two_prod(rh, rh);  // r^2
  DD c = two_prod(q.hi, rh);  // r^3
  c.lo = ::fma(q.lo, rh, c.lo);
  const double t3h = c.hi * kThirdHi;  // r^3 / 3 = t3h + t3l
  const double t3l = ::fma(c.hi, kThirdHi, -t3h) + (c.hi * kThirdLo + c.lo * kThirdHi);
  // -1/4 + r/5 - r^2/6 + r^3/7 - r^4/8 + r^5/9 - r^6/10 by Estrin's scheme (short dependency chain)
  const double r4 = q.hi * q.hi;
  const double e01 = ::fma(0.2, rh, -0.25), e23 = ::fma(1.0 / 7.0, rh, -1.0 / 6.0);
  const double e45 = ::fma(1.0 / 9.0, rh, -0.125);
  const double poly = ::fma(r4, ::fma(-0.1, q.hi, e45), ::fma(e23, q.hi, e01));
  const double tail = r4 * poly;
  const double rl_term = rl * ((1.0 - rh) + q.hi);
  const double de = static_cast<double>(e);
  DD E = two_prod(de, kLn2Hi);
  E.lo = ::fma(de, kLn2Lo, E.lo);
  DD s1 = quick_two_sum(kLogT_hi[j], rh);
  DD s2 = quick_two_sum(E.hi, s1.hi);
  DD s3 = quick_two_sum(s2.hi, -0.5 * q.hi);
  DD s4 = quick_two_sum(s3.hi, t3h);
  const double lo = (((s1.lo + s2.lo) + (s3.lo + s4.lo)) + (E.lo + kLogT_lo[j])) +
                    ((t3l - 0.5 * q.lo) + (tail + rl_term));
  return quick_two_sum(s4.hi, lo);
}
VMF_INLINE DD log(double x) { return log(DD(x)); }

}  // namespace dd
}  // namespace vmfdist
