// Modified Bessel functions of the first kind: ratios, logarithms, bounds and the
// papers' approximations.  Written once, host-device; the CPU and CUDA kernels
// are loops around the scalar functions at the bottom of this file.
//
// Notation: R_nu(z) = I_nu(z) / I_{nu-1}(z),  C_nu(z) = 1 - R_nu(z).
//
// Algorithms (docs/special.md gives the derivations and the measured accuracy):
//  * R and C: Perron's continued fraction (Gautschi & Slavik 1978)
//        R = z / (z + f),   C = f / (z + f),
//        f = 2nu + a_1/(b_1 + a_2/(b_2 + ...)),  a_k = -(2nu+2k-1) z,  b_k = 2(nu+z) + k,
//    summed as a series of same-signed terms.  The leading term is folded into
//    2nu algebraically so that f, which tends to nu - 1/2 as z -> inf, is formed
//    without cancellation.  Double precision for nu >= 1, double-double for the
//    complement when 1/2 < nu < 1; nu = 1/2 is tanh.
//  * d/dz log I_nu = R_{nu+1} + nu/z and d/dz log(I_nu e^{-z}) = h/(z+f) + (nu/z) C_{nu+1}
//    with h = nu - f_{nu+1} from the same fraction (again folded so nothing cancels
//    except at the true zero of the derivative).  dR/dz by forward-mode dual numbers
//    through the fraction.
//  * log I: Olver's uniform expansion (DLMF 10.41.3) for nu >= 20 (and for
//    12 <= nu < 20 when z > nu), with the large
//    terms sqrt(nu^2+z^2) + nu log(z/(nu+sqrt(nu^2+z^2))) in double-double; for
//    smaller nu the power series in double-double (z below a threshold) or Hankel's
//    expansion (z above it).
#pragma once

#include <cmath>

#include "vmfdist/dd.h"
#include "vmfdist/macros.h"
#include "vmfdist/olver_coeffs.h"

namespace vmfdist {
namespace bessel {

// ---------------------------------------------------------------------------
// Forward-mode dual numbers (value, derivative w.r.t. z), over double or DD.
template <class T>
struct Dual {
  T v;
  T d;
  VMF_HD Dual() : v(0.0), d(0.0) {}
  VMF_HD Dual(double x) : v(x), d(0.0) {}  // NOLINT: constants
  VMF_HD Dual(T x, T dx) : v(x), d(dx) {}
};
template <class T>
VMF_INLINE Dual<T> operator+(Dual<T> a, Dual<T> b) { return Dual<T>(a.v + b.v, a.d + b.d); }
template <class T>
VMF_INLINE Dual<T> operator+(Dual<T> a, double b) { return Dual<T>(a.v + b, a.d); }
template <class T>
VMF_INLINE Dual<T> operator-(Dual<T> a) { return Dual<T>(-a.v, -a.d); }
template <class T>
VMF_INLINE Dual<T> operator-(Dual<T> a, Dual<T> b) { return Dual<T>(a.v - b.v, a.d - b.d); }
template <class T>
VMF_INLINE Dual<T> operator-(Dual<T> a, double b) { return Dual<T>(a.v - b, a.d); }
template <class T>
VMF_INLINE Dual<T> operator*(Dual<T> a, Dual<T> b) { return Dual<T>(a.v * b.v, a.v * b.d + a.d * b.v); }
template <class T>
VMF_INLINE Dual<T> operator*(Dual<T> a, double b) { return Dual<T>(a.v * b, a.d * b); }
template <class T>
VMF_INLINE Dual<T> operator/(Dual<T> a, Dual<T> b) {
  T q = a.v / b.v;
  return Dual<T>(q, (a.d - q * b.d) / b.v);
}
template <class T>
VMF_INLINE Dual<T> operator/(double a, Dual<T> b) { return Dual<T>(a) / b; }

VMF_INLINE double lead(double x) { return x; }
VMF_INLINE double lead(DD x) { return x.hi; }
template <class T>
VMF_INLINE double lead(Dual<T> x) { return lead(x.v); }

// |t| small against |s| (for duals: the derivative part too).
VMF_INLINE bool negligible(double t, double s, double tol) { return ::fabs(t) <= tol * ::fabs(s); }
VMF_INLINE bool negligible(DD t, DD s, double tol) { return ::fabs(t.hi) <= tol * ::fabs(s.hi); }
template <class T>
VMF_INLINE bool negligible(Dual<T> t, Dual<T> s, double tol) {
  return negligible(t.v, s.v, tol) && negligible(t.d, s.d, tol);
}

template <class T> VMF_INLINE double tolerance();
template <> VMF_INLINE double tolerance<double>() { return 0x1p-55; }
template <> VMF_INLINE double tolerance<DD>() { return 0x1p-106; }
template <> VMF_INLINE double tolerance<Dual<double>>() { return 0x1p-55; }
template <> VMF_INLINE double tolerance<Dual<DD>>() { return 0x1p-106; }
template <> VMF_INLINE double tolerance<Dual<Dual<double>>>() { return 0x1p-55; }
template <> VMF_INLINE double tolerance<Dual<Dual<DD>>>() { return 0x1p-106; }

constexpr int kMaxFractionTerms = 20000;
// Where nu or z exceeds kHugeArg the fraction's b_1 = 2(nu + z) + 1 overflows (and its
// scaling 2^-e would leave the normal range); there the ratio functions use the leading
// uniform asymptotic form below, whose relative error O(1/max(nu, z)) <= 2^-1000 is far
// below rounding.
constexpr double kHugeArg = 0x1p1000;

// ---------------------------------------------------------------------------
// Leading uniform asymptotics, for max(mu, z) > kHugeArg (z > 0 finite, mu >= 0):
//   R_mu(z) = z / (s + h),  s = mu - 1/2,  h = sqrt(s^2 + z^2)
// (both of Ruiz-Antolin & Segura's theorem-5 bounds tend to it; corrections are relative
// O(1/max(mu, z)) and, for C = 1 - R when z >> mu, O(1/z) relative to C's own size
// (mu - 1/2)/z as long as mu - 1/2 >= 2^-53, i.e. always for double mu > 1/2), with
//   C = 1 - R = (s + s^2/(h + z)) / (s + h)   (h - z = s^2/(h + z): nothing cancels),
//   dR/dz = s / (h (s + h)).
// Everything at a quarter scale (exact), so that h and s + h cannot overflow near DBL_MAX.
struct HugeForm {
  double s, h4, den4;  // s, h/4, (s + h)/4
};
VMF_INLINE HugeForm huge_form(double s, double z) {
  HugeForm f;
  f.s = s;
  f.h4 = ::hypot(0.25 * s, 0.25 * z);
  f.den4 = 0.25 * s + f.h4;
  return f;
}
VMF_INLINE double huge_ratio(double s, double z, bool complement) {
  const HugeForm f = huge_form(s, z);
  if (!complement) return (z / f.den4) * 0.25;
  return (s / f.den4) * 0.25 * (1.0 + (0.25 * s) / (f.h4 + 0.25 * z));
}
VMF_INLINE double huge_ratio_grad(double s, double z) {
  const HugeForm f = huge_form(s, z);
  return ((s / f.h4) / f.den4) * 0.0625;
}

// ---------------------------------------------------------------------------
// Perron's continued fraction for order mu >= 1/2 at 0 < z <= kHugeZ.
//   f_mu(z) = z C_mu / R_mu = 2mu + sum_{k>=1} t_k,  all t_k < 0.
// Returned split as f = head + rest, where head = 2mu + t_1 (formed without
// cancellation) and rest = sum_{k>=2} t_k, and also m = (mu - 1) - f =
// -((2mu+1)(mu+1) + z)/(2mu+2z+1) - rest, needed by the scaled log-derivative.
template <class T>
struct Fraction {
  T head;
  T rest;
  VMF_HD T f() const { return head + rest; }
};

// x * y + w: one rounding for double (the hardware fma), the type's own operations otherwise.
VMF_INLINE double mul_add(double x, double y, double w) { return ::fma(x, y, w); }
template <class T>
VMF_INLINE T mul_add(T x, T y, T w) { return x * y + w; }

// The terms t_k come from the Wallis denominators of the fraction,
//   B_0 = 1, B_1 = b_1, B_k = b_k B_{k-1} + a_k B_{k-2}   (a_k = -c_k z, c_k = 2mu+2k-1),
// and the determinant identity  t_k = A_k/B_k - A_{k-1}/B_{k-1} = D_k / (B_k B_{k-1}),
// D_1 = a_1, D_k = -a_k D_{k-1}.  Two consecutive terms combine, since
// B_{k+1} - a_{k+1} B_{k-1} = b_{k+1} B_k, into
//   t_k + t_{k+1} = D_k b_{k+1} / (B_{k-1} B_{k+1}),
// a product of rounded factors with no addition at all.  This is the series of the
// forward series algorithm (t_k = t_{k-1}(g_k - 1), g_k = b_k B_{k-1}/B_k) with the same
// error behaviour -- each term carries a relative error of O(k) roundings, and the
// same-signed terms shrink geometrically, so the first few set the error of the sum --
// but the loop-carried dependency is one fma per term instead of a division, and one
// division serves two terms, off the critical path.  (Perron's fraction converges
// geometrically: about 22 terms for z ~ nu at large nu, up to ~60 for nu near 1.)
// The loop takes four terms per iteration and tests convergence on the last pair
// without dividing (|num| <= tol f den), so that the branch that ends it -- mispredicted
// once per call -- does not wait for a division.
// Scaling: everything is multiplied by powers of sigma = 2^-e ~ 1/b_1 (exact), so that
// b_k sigma is in [1, 2) at first: B_k sigma^k, D_k sigma^(2k-1), a_k sigma^2.  The
// t_k are unchanged.  B_k sigma^k changes by a factor between b_k sigma / 2 and b_k sigma
// per term (g_k lies in [1, 2] for this fraction), so it stays far from overflow for the
// few dozen terms needed; a guard rescales anyway.
template <class T, class M = double>
VMF_INLINE Fraction<T> perron(M mu, T z) {
  const double tol = tolerance<T>();
  const T c1 = T(mu * 2.0) + 1.0;   // c_1 = 2mu + 1
  const T b1 = c1 + z * 2.0;        // b_1 = 2(mu + z) + 1
  const double sigma = dd::pow2_recip(lead(b1));
  const T zs = z * sigma;           // z sigma
  T beta = b1 * sigma;              // b_k sigma, in [1, 2) for k = 1
  T gamma = c1 * sigma;             // c_k sigma
  T head;
  if (lead(z) <= lead(mu)) {
    // t_1 = -c_1 z / b_1 and |t_1| <= 2mu / 2 here (mu >= 1/2), so the plain sum 2mu + t_1 is
    // accurate: about half an ulp plus a fraction of t_1's error, against ~1.5 ulp for the
    // folded form below (which made R 4.09 ulp off at nu = 66957.9142664298, z = 30.599215019053574).
    head = T(mu * 2.0) - gamma * z / beta;
  } else {
    // head = 2mu + t_1 = (2mu(2mu+1) + (2mu-1) z) / b_1 = (mu - 1/2) + (mu + 1/2) c_1 / b_1:
    // two non-negative terms for mu >= 1/2 (mu -+ 1/2 exact unless a binade is crossed),
    // where 2mu + t_1 would cancel (z >> mu: head -> mu - 1/2); b_1 is formed from the
    // same rounded c_1, so that the rounding of c_1 cancels in c_1 / b_1.  Nothing
    // overflows: c_1 / b_1 <= 1 and z <= kHugeZ.
    head = (T(mu) - 0.5) + (T(mu) + 0.5) * gamma / beta;
  }
  T rest = T(0.0);
  T B_prev = T(1.0);   // B_0
  T B = beta;          // B_1 sigma
  T D = -(gamma * z);  // D_1 sigma = a_1 sigma = -(c_1 sigma) z
  const double sigma2 = 2.0 * sigma;
  for (int k = 2; k < kMaxFractionTerms; k += 4) {
    // terms k .. k+3; on entry B_prev = B_{k-2}, B = B_{k-1}, D = D_{k-1} (all scaled)
    const T beta1 = beta + sigma, beta2 = beta + sigma2;
    const T beta3 = beta2 + sigma, beta4 = beta2 + sigma2;
    const T gamma1 = gamma + sigma2, gamma2 = gamma1 + sigma2;
    const T gamma3 = gamma2 + sigma2, gamma4 = gamma3 + sigma2;
    beta = beta4;
    gamma = gamma4;
    const T alpha1 = -(gamma1 * zs), alpha2 = -(gamma2 * zs);  // a_k sigma^2 < 0, ...
    const T alpha3 = -(gamma3 * zs), alpha4 = -(gamma4 * zs);
    const T B1 = mul_add(beta1, B, alpha1 * B_prev);  // B_k
    const T B2 = mul_add(beta2, B1, alpha2 * B);      // B_{k+1}
    const T B3 = mul_add(beta3, B2, alpha3 * B1);     // B_{k+2}
    const T B4 = mul_add(beta4, B3, alpha4 * B2);     // B_{k+3}
    const T D1 = -(alpha1 * D);                        // D_k
    const T D3 = (alpha2 * alpha3) * D1;               // D_{k+2}
    const T num2 = D3 * beta4, den2 = B2 * B4;         // t_{k+2} + t_{k+3} = num2 / den2
    const bool done = negligible(num2, (head + rest) * den2, tol);
    rest = rest + ((D1 * beta2) / (B * B2) + num2 / den2);
    if (done) break;
    D = -(alpha4 * D3);  // D_{k+3}
    B_prev = B3;
    B = B4;
    // Keep B (and D ~ t B^2) in range, so that B^2 can neither overflow nor underflow.
    if (!(lead(B) < 0x1p200 && lead(B) > 0x1p-200)) {
      double s = lead(B) > 1.0 ? 0x1p-400 : 0x1p400;
      B_prev = B_prev * s;
      B = B * s;
      D = D * (s * s);
    }
  }
  return Fraction<T>{head, rest};
}

// (mu - 1) - f_mu for the same fraction, without cancelling head against 2mu.
template <class T>
VMF_INLINE T perron_shifted(T mu, T z, const Fraction<T>& fr) {
  T p;
  if (lead(mu) > 0x1p500) {
    // (2mu+1)(mu+1) below overflows for mu >~ 2^511 (d/dz log_bessel_ive was -inf at
    // nu = 1e180): the same quotient as a sum of two positive parts.
    const T c1 = mu * 2.0 + 1.0, den = c1 + z * 2.0;
    return -((mu + 1.0) * (c1 / den) + z / den) - fr.rest;
  }
  T c = (mu * 2.0 + 1.0) * (mu + 1.0);
  if (lead(z) <= 1.0) {
    p = (c + z) / ((mu * 2.0 + z * 2.0) + 1.0);
  } else {
    T iz = 1.0 / z;
    p = (c * iz + 1.0) / ((mu * 2.0 + 1.0) * iz + 2.0);
  }
  return -p - fr.rest;
}

// ---------------------------------------------------------------------------
// R_nu(z) (complement = false) or C_nu(z) = 1 - R_nu(z) (complement = true) for
// nu >= 1/2 (NaN below); iv_ratio below extends R to 0 <= nu < 1/2.
VMF_INLINE double iv_ratio_upper(double nu, double z, bool complement) {
  if (is_nan(nu) || is_nan(z) || nu < 0.5 || z < 0.0) return NAN;
  if (is_inf(nu)) return is_inf(z) ? NAN : (complement ? 1.0 : 0.0);
  if (z == 0.0) return complement ? 1.0 : 0.0;
  if (is_inf(z)) return complement ? 0.0 : 1.0;
  if (nu == 0.5) return complement ? 2.0 / (1.0 + ::exp(2.0 * z)) : ::tanh(z);
  if (nu > kHugeArg || z > kHugeArg) return huge_ratio(nu - 0.5, z, complement);
  if (complement && nu < 1.0) {
    Fraction<DD> fr = perron<DD>(nu, DD(z));
    DD f = fr.f();
    return dd::to_double(f / (f + z));
  }
  Fraction<double> fr = perron<double>(nu, z);
  double f = fr.head + fr.rest;
  return complement ? f / (z + f) : z / (z + f);
}

// dR_nu/dz for nu >= 1/2.
VMF_INLINE double iv_ratio_grad_upper(double nu, double z) {
  if (is_nan(nu) || is_nan(z) || nu < 0.5 || z < 0.0) return NAN;
  if (is_inf(nu)) return is_inf(z) ? NAN : 0.0;
  if (z == 0.0) return 0.5 / nu;
  if (is_inf(z)) return 0.0;
  if (nu == 0.5) {
    double c = ::cosh(z);
    return 1.0 / (c * c);
  }
  if (nu > kHugeArg || z > kHugeArg) return huge_ratio_grad(nu - 0.5, z);
  double f, df;
  if (nu < 1.0) {
    Fraction<Dual<DD>> fr = perron<Dual<DD>>(nu, Dual<DD>(DD(z), DD(1.0)));
    Dual<DD> fd = fr.f();
    DD zf = fd.v + z;
    return dd::to_double(((fd.v - fd.d * z) / zf) / zf);
  }
  Fraction<Dual<double>> fr = perron<Dual<double>>(nu, Dual<double>(z, 1.0));
  Dual<double> fd = fr.f();
  f = fd.v;
  df = fd.d;
  double zf = z + f;
  return ((f - z * df) / zf) / zf;
}

// d^2R_nu/dz^2 for nu >= 1/2.  From R = z/g with g = z + f (Perron's f):
//   R'' = -z g''/g^2 - 2 (g - z g') g'/g^3,   g - z g' = f - z f',
// with f, f', f'' by second-order dual numbers through the fraction.  Both terms have
// the same sign for small z (R'' ~ -3z/(4 nu^2 (nu+1))), where the Riccati form
// -2RR' - (2nu-1)(R'/z - R/z^2) cancelled completely (+5.5e-12 instead of -3.8e-12 at
// nu = 125, z = 1e-5).  g' = 1 + f' itself cancels for z << nu (f' -> -1), so for z <= nu
// g is formed as 2nu + 2z^2/b_1 + rest (z + the fraction's head, folded; b_1 = 2nu + 2z + 1)
// and f - z f' as g - z g'; for z > nu, f - z f' comes from f directly (g - z g' would
// cancel as f -> nu - 1/2).  Double-double for nu < 1 (f - z f' is small there), as for R'.
template <class S>
VMF_INLINE double ratio_grad2_fraction(double nu, double z) {
  using T = Dual<Dual<S>>;
  const T zd(Dual<S>(S(z), S(1.0)), Dual<S>(S(1.0), S(0.0)));
  const Fraction<T> fr = perron<T>(nu, zd);
  T g;
  S h;  // f - z f'
  if (z <= nu) {
    const T b1 = zd * 2.0 + (2.0 * nu + 1.0);
    g = (T(2.0 * nu) + (zd * zd * 2.0) / b1) + fr.rest;
    h = g.v.v - g.v.d * z;
  } else {
    const T f = fr.f();
    g = zd + f;
    h = f.v.v - f.v.d * z;
  }
  const S gv = g.v.v, g1 = g.v.d, g2 = g.d.d;
  // R'' = -(z/g)(g''/g) - 2 (h/g)(g'/g)(1/g)
  return dd::to_double(-((S(z) / gv) * (g2 / gv)) - (((h / gv) * (g1 / gv)) / gv) * 2.0);
}

VMF_INLINE double iv_ratio_grad2_upper(double nu, double z) {
  if (is_nan(nu) || is_nan(z) || nu < 0.5 || z < 0.0) return NAN;
  if (is_inf(nu)) return is_inf(z) ? NAN : 0.0;
  if (z == 0.0 || is_inf(z)) return 0.0;
  if (nu == 0.5) {
    const double c = ::cosh(z);
    return -2.0 * ::tanh(z) / (c * c);
  }
  if (nu > kHugeArg || z > kHugeArg) {
    // R = z/(s + h): R'' = -(s/h)(z/h)((s + 2h)/h) / (s + h)^2, at the quarter scale
    const HugeForm f = huge_form(nu - 0.5, z);
    const double a = ((0.25 * f.s) / f.h4) * ((0.25 * z) / f.h4) * ((0.25 * f.s + 2.0 * f.h4) / f.h4);
    return -((a / f.den4) / f.den4) * 0.0625;
  }
  if (nu < 1.0) return ratio_grad2_fraction<DD>(nu, z);
  return ratio_grad2_fraction<double>(nu, z);
}

// 0 <= nu < 1/2: there I_{nu-1} > 0 for z > 0, so the ratio is defined (it exceeds 1 for
// large z and tends to 1 from above).  From the recurrence 1/R_nu = 2nu/z + R_{nu+1} (all
// terms >= 0; nu + 1 in [1, 3/2), where Perron's fraction applies), with q = 2nu/z:
//   R = 1/(q + R_{nu+1})   (R = z/(2nu) to relative 2^-1000 where q is beyond 2^1000),
//   R' = (q R)(R/z) - R'_{nu+1} R^2   (q R <= 1 and R/z = 1/(2nu + z R_{nu+1}): no spurious
//        overflow; the two terms cancel only at the maximum of R, a true zero),
//   R'' = -R1''/R1^2 + 2 R1'^2/R1^3 (nu = 0, R = 1/R1), else for z < 4 with E = 2nu + z R1
//   (R = z/E): R'' = -(z/E)(E''/E) - 2 ((E - z E')/E)(E'/E)/E,  E' = R1 + z R1',  E'' = 2 R1' + z R1''
//   (both terms of one sign for small z) and for z >= 4 from R = 1/D (below).
// Above order 0 and for large z the recurrence forms nu - 1/2 as 2nu - (nu + 1/2): R itself
// is unaffected (R -> 1), but R' and R'' lose a factor up to (1 + 4nu)/(1 - 2nu) there.
// z > 0 finite.  R_0(0) = +inf (R_0 = I_0/I_1 ~ 2/z), R_nu(0) = 0 otherwise.
constexpr double kLowGrad2Switch = 4.0;  // R'' below 1/2: E form for z below, D form above

VMF_INLINE double iv_ratio_low(double nu, double z) {
  const double q = 2.0 * nu / z;
  if (!(q < kHugeArg)) return z / (2.0 * nu);
  return 1.0 / (q + iv_ratio_upper(nu + 1.0, z, false));
}

VMF_INLINE double iv_ratio_low_grad(double nu, double z) {
  const double q = 2.0 * nu / z;
  if (!(q < kHugeArg)) return 0.5 / nu;
  const double r = 1.0 / (q + iv_ratio_upper(nu + 1.0, z, false));
  return (q * r) * (r / z) - iv_ratio_grad_upper(nu + 1.0, z) * r * r;
}

VMF_INLINE double iv_ratio_low_grad2(double nu, double z) {
  const double r1 = iv_ratio_upper(nu + 1.0, z, false), d1 = iv_ratio_grad_upper(nu + 1.0, z);
  const double d2 = iv_ratio_grad2_upper(nu + 1.0, z);
  if (nu == 0.0) return -(d2 / r1) / r1 + 2.0 * ((d1 / r1) * (d1 / r1)) / r1;
  if (z < kLowGrad2Switch) {
    const double e = 2.0 * nu + z * r1, e1 = r1 + z * d1, e2 = 2.0 * d1 + z * d2;
    return -(z / e) * (e2 / e) - 2.0 * (((e - z * e1) / e) * (e1 / e)) / e;
  }
  // R = 1/D, D = q + R1: R'' = (2 D'^2/D - D'')/D^2, D' = R1' - q/z, D'' = R1'' + 2q/z^2 (E'' above
  // cancels for large z, these only by the factor (1 + 4nu)/(1 - 2nu) of forming nu - 1/2)
  const double q = 2.0 * nu / z;
  const double dd0 = q + r1, dd1 = d1 - q / z, dd2 = d2 + 2.0 * ((q / z) / z);
  return ((2.0 * dd1) * (dd1 / dd0) - dd2) / dd0 / dd0;
}

// R_nu(z) (complement = false) or C_nu(z) = 1 - R_nu(z) (complement = true).
// Domain nu >= 0 for R (nu >= 1/2 for C), z >= 0; NaN outside.
VMF_INLINE double iv_ratio(double nu, double z, bool complement) {
  if (nu >= 0.0 && nu < 0.5 && !complement && z >= 0.0) {
    if (z == 0.0) return nu == 0.0 ? INFINITY : 0.0;
    return is_inf(z) ? 1.0 : iv_ratio_low(nu, z);
  }
  return iv_ratio_upper(nu, z, complement);
}

// dR_nu/dz, nu >= 0.
VMF_INLINE double iv_ratio_grad(double nu, double z) {
  if (nu >= 0.0 && nu < 0.5 && z >= 0.0) {
    if (z == 0.0) return nu == 0.0 ? -INFINITY : 0.5 / nu;
    return is_inf(z) ? 0.0 : iv_ratio_low_grad(nu, z);
  }
  return iv_ratio_grad_upper(nu, z);
}

// d^2R_nu/dz^2, nu >= 0.
VMF_INLINE double iv_ratio_grad2(double nu, double z) {
  if (nu >= 0.0 && nu < 0.5 && z >= 0.0) {
    if (z == 0.0) return nu == 0.0 ? INFINITY : 0.0;
    return is_inf(z) ? 0.0 : iv_ratio_low_grad2(nu, z);
  }
  return iv_ratio_grad2_upper(nu, z);
}

// d/dz log I_nu(z) (scaled: d/dz log(I_nu(z) e^{-z})).  Domain nu >= 0, z >= 0.
VMF_INLINE double log_iv_grad(double nu, double z, bool scaled) {
  if (is_nan(nu) || is_nan(z) || nu < 0.0 || z < 0.0) return NAN;
  if (is_inf(nu)) return is_inf(z) ? NAN : INFINITY;
  if (z == 0.0) return nu == 0.0 ? (scaled ? -1.0 : 0.0) : INFINITY;
  if (is_inf(z)) return scaled ? 0.0 : 1.0;
  if (nu > kHugeArg || z > kHugeArg) {
    // R_{nu+1} + nu/z (two positive terms).  Scaled: the leading terms of Olver's expansion
    // give d/dz log(I e^{-z}) = A/z - 1 - z/(2A^2) + O(1/A^2) (A = hypot(nu, z)), i.e.
    // nu^2/(z (A + z)) - z/(2A^2), which cancels only at its true zero (nu^2 ~ z), whereas
    // nu/z - C_{nu+1} would cancel long before.  Quarter scale against overflow.
    if (!scaled) return huge_ratio(nu + 0.5, z, false) + nu / z;
    const double a4 = ::hypot(0.25 * nu, 0.25 * z);
    return (nu / z) * ((0.25 * nu) / (a4 + 0.25 * z)) - (((0.25 * z) / a4) / a4) * 0.125;
  }
  const double mu = nu + 1.0;
  Fraction<double> fr = perron<double>(mu, z);
  double f = fr.head + fr.rest;
  double zf = z + f;
  if (!scaled) return z / zf + nu / z;  // both terms positive
  double h = perron_shifted<double>(mu, z, fr);  // nu - f_{nu+1}
  double a = h / zf, b = (nu / z) * (f / zf);
  // The sum magnifies the terms' relative errors (a few ulp each) by (|a| + |b|) / |a + b|:
  // at most 2 here.  (With 0.25, i.e. up to 4x, nu = 30, z = 215.87 had 11.3 ulp.)
  if (::fabs(a + b) >= 0.5 * (::fabs(a) + ::fabs(b))) return a + b;
  // The scaled derivative has a zero (the maximum of I_nu(z) e^{-z}); near it the two
  // terms cancel, so redo the sum in double-double with the exact order nu + 1.
  DD mu_dd = dd::two_sum(nu, 1.0);
  Fraction<DD> frd = perron<DD, DD>(mu_dd, DD(z));
  DD fd = frd.f();
  DD zfd = fd + z;
  DD hd = perron_shifted<DD>(mu_dd, DD(z), frd);
  return dd::to_double(hd / zfd + (DD(nu) / z) * (fd / zfd));
}

// ---------------------------------------------------------------------------
// log I_nu(z) pieces, each returning a double-double.

// log Gamma(x) for 1 <= x < 64, in double-double: shift up to y >= 13 and use Stirling.
// The Stirling series is summed in double through the 1/(156 y^13) term; the first
// omitted term, 3617/(122400 y^15), is below 2^-60 for y >= 13, and the rounding of the
// double sum (|sum| < 1/(12 y)) below 2^-60 as well.
VMF_INLINE DD lgamma_dd(DD x) {
  if (x.lo == 0.0 && (x.hi == 1.0 || x.hi == 2.0)) return DD(0.0);
  DD y = x;
  DD prod = DD(1.0);
  while (y.hi < 13.0) {
    prod = prod * y;
    y = y + 1.0;
  }
  DD r = (y - 0.5) * dd::log(y) - y + DD(0.9189385332046728, -3.8782941580672414e-17);
  double iy = 1.0 / y.hi;
  double iy2 = iy * iy;
  double series =
      iy * (1.0 / 12 + iy2 * (-1.0 / 360 + iy2 * (1.0 / 1260 + iy2 * (-1.0 / 1680 +
            iy2 * (1.0 / 1188 + iy2 * (-691.0 / 360360 + iy2 * (1.0 / 156)))))));
  return r + series - dd::log(prod);
}

// Power series: log I = nu log(z/2) - log Gamma(nu+1) + log sum_k (z^2/4)^k / (k! (nu+1)_k).
// All terms are positive; each is carried in double-double (relative error O(k 2^-104))
// and the sum stops once a term is below 2^-60 of it (the terms then fall faster than
// geometrically, so the tail is smaller still): log s to far better than 2^-56.
VMF_INLINE DD log_iv_series(double nu, double z) {
  const DD x = dd::two_prod(0.5 * z, 0.5 * z);
  DD s = DD(1.0), t = DD(1.0);
  for (int k = 1; k < 2000; ++k) {
    const double dk = static_cast<double>(k);
    t = t * dd::div(x, dd::two_sum(nu, dk) * dk);  // t_k = t_{k-1} x / ((nu + k) k)
    DD u = dd::two_sum(s.hi, t.hi);                 // s + t, both positive
    u.lo += s.lo + t.lo;
    s = dd::quick_two_sum(u.hi, u.lo);
    if (t.hi <= 0x1p-60 * s.hi) break;
  }
  DD log_half_z = dd::log(z) - DD(dd::kLn2Hi, dd::kLn2Lo);
  return log_half_z * nu - lgamma_dd(dd::two_sum(nu, 1.0)) + dd::log(s);
}

// Hankel's expansion: I_nu(z) ~ e^z / sqrt(2 pi z) sum_k (-1)^k a_k(nu) / z^k.
// Returns log I (scaled = false) or log I - z.
VMF_INLINE DD log_iv_hankel(double nu, double z, bool scaled) {
  double term = 1.0, s = 0.0;
  for (int k = 1; k < 200; ++k) {
    double m = static_cast<double>(2 * k - 1);
    term *= -((2.0 * nu - m) * (2.0 * nu + m)) / (8.0 * k * z);
    s += term;
    if (::fabs(term) <= 0x1p-60 * ::fabs(1.0 + s)) break;
  }
  DD half_log = (dd::log(z) + DD(dd::kLog2PiHi, dd::kLog2PiLo)) * 0.5;
  DD r = ::log1p(s) - half_log;
  return scaled ? r : r + z;
}

// Olver's uniform asymptotic expansion (see kOlverMinOrder for where it is used):
//   log I_nu(z) = A - nu L - log(2 pi A)/2 + log1p(s),
//   A = sqrt(nu^2 + z^2),  L = log((nu + A) / z) = arsinh(nu / z),  s = sum_{k>=1} u_k(p)/nu^k,
// with p = nu / A.  For scaled, A - z = nu^2 / (A + z).
// Precision: A and nu L are both of size ~nu and cancel near the turning point
// z ~ 0.66 nu (docs/special.md), so A, L and their difference are carried in
// double-double: the squares and sqrt exactly up to 2^-104, L by one double-double
// division and dd::log (error < 2^-88 absolute, i.e. < 2^-68 after multiplying by
// nu <= 2^20, far below the 2^-52 |log I| budget).  log(2 pi A)/2 (|.| up to ~350) is
// taken in double-double as well, since near log I ~ 0 its rounding would show.  Only
// s = O(1/nu) is summed in double: an absolute error of a few 2^-53 |s| <= 2^-59.
VMF_INLINE DD log_iv_olver(double nu, double z, bool scaled) {
  // The squares must not overflow: rescale by an exact power of two when needed.
  double nus = nu, zs = z, unscale = 1.0;
  if (!(nu < 0x1p500 && z < 0x1p500)) {
    nus *= 0x1p-600;
    zs *= 0x1p-600;
    unscale = 0x1p600;
  }
  // Near DBL_MAX, A and nu + A overflow although log I (as small as ~0.53 nu at nu = z)
  // does not: there every large term is carried at a quarter scale hs (exact; nu + A <=
  // (1 + sqrt 2) DBL_MAX) and the sum multiplied back at the end (overflowing to inf only
  // if log I itself does).
  const double hs = (nu > 0x1p1020 || z > 0x1p1020) ? 0.25 : 1.0;
  const DD log_inv_hs = DD(2.0 * dd::kLn2Hi, 2.0 * dd::kLn2Lo);  // log(1/hs) where hs != 1
  const double nu_h = nu * hs;
  const DD a = dd::sqrt(dd::two_prod(nus, nus) + dd::two_prod(zs, zs)) * (unscale * hs);  // A hs
  const DD an = a + nu_h;                                                                 // (nu + A) hs
  // L = log((nu + A) / z); the quotient only when it is far from overflow (an / z >= hs always).
  DD L;
  if (nu < z * 0x1p-20) {
    // L = arsinh(x), x = nu/z < 2^-20: log((nu + A)/z) = log(1 + x + ...) loses x entirely once
    // it is below the double-double precision (log_bessel_ive was 5.9 eps off at nu = 3.2e147,
    // z = 2.2e307, where nu L ~ nu^2/z matters): x (1 - x^2/6 + 3x^4/40 - 5x^6/112) instead,
    // the first omitted term x^8 35/1152 below 2^-160 relative.
    const DD x = dd::div(DD(nu), z);
    const double x2 = x.hi * x.hi;
    const double c = x2 * (-1.0 / 6.0 + x2 * (3.0 / 40.0 - x2 * (5.0 / 112.0)));
    L = x + x.hi * c;
  } else {
    L = (z > an.hi * 0x1p-1000) ? dd::log(dd::div(an, z)) : dd::log(an) - dd::log(z);
    if (hs != 1.0) L = L + log_inv_hs;
  }
  // s = sum_k u_k(p) / nu^k = sum_k y^k P_k(p^2),  y = p / nu,  u_k(p) = p^k P_k(p^2),
  // by Horner in y over the K terms for which max|u_k| / nu^k >= 2^-58 (the rest is
  // below 2^-57 in all: an absolute error of s, and of log I, of at most 2^-57).
  const double inv = 1.0 / nu, p = nu_h / a.hi, p2 = p * p, y = p * inv;
  int K = 1;
  for (double ik = inv * inv; K < olver::kTerms && olver::kMaxAbsU[K + 1] * ik >= 0x1p-58; ik *= inv) ++K;
  double s = 0.0;
  for (int k = K; k >= 1; --k) {
    double poly = olver::kU[k][k];
    for (int j = k - 1; j >= 0; --j) poly = ::fma(poly, p2, olver::kU[k][j]);
    s = ::fma(s, y, poly);
  }
  s *= y;
  // log1p(s) for |s| <= 0.0074 (nu >= 12: max|u_1| / 12 plus the rest), to 2^-62:
  // s - s^2/2 + ... - s^10/10 (the next term is below 2^-72).
  double l1 = -0.1;
  l1 = ::fma(l1, s, 1.0 / 9.0);
  l1 = ::fma(l1, s, -0.125);
  l1 = ::fma(l1, s, 1.0 / 7.0);
  l1 = ::fma(l1, s, -1.0 / 6.0);
  l1 = ::fma(l1, s, 0.2);
  l1 = ::fma(l1, s, -0.25);
  l1 = ::fma(l1, s, 1.0 / 3.0);
  l1 = ::fma(l1, s, -0.5);
  const double log1p_s = ::fma(l1 * s, s, s);
  // nu^2 / (A + z) = nu (nu/2) / (A/2 + z/2): A + z itself overflows for z near DBL_MAX
  // (and a quotient by inf would give NaN in the double-double division).
  // (At half scale: nu/(A + z) = (nu hs/2) / (A hs/2 + z hs/2), times nu hs.)
  const DD lead = scaled ? dd::div(DD(0.5 * nu_h), a * 0.5 + 0.5 * hs * z) * nu_h : a;
  DD log_a = dd::log(a);
  if (hs != 1.0) log_a = log_a + log_inv_hs;
  // Sum lead - nu L - (log a + log 2 pi)/2 + log1p(s).  The two cancellations (lead
  // against nu L near the turning point, then against half_log where log I ~ 0) are
  // taken by error-free two_sums of the leading parts; all the remainders are below
  // 2^-52 times the larger part (or |log1p(s)| < 0.0075), so their plain-double sum
  // adds at most ~2^-60 (absolute) before the single rounding to double.
  const DD nu_L = dd::two_prod(L.hi, nu_h);
  const DD h = dd::two_sum(log_a.hi, dd::kLog2PiHi);
  const DD big = dd::two_sum(lead.hi, -nu_L.hi);
  // nu L overflows where log I does (e.g. nu = 2e307, z = 1e-45): -inf, not the NaN of the
  // error terms.
  if (is_inf(big.hi)) return DD(big.hi);
  const DD r = dd::two_sum(big.hi, -0.5 * hs * h.hi);
  const double rest = ((r.lo + big.lo) + (lead.lo - (nu_L.lo + L.lo * nu_h))) -
                      0.5 * hs * ((h.lo + log_a.lo) + dd::kLog2PiLo) + hs * log1p_s;
  if (hs == 1.0) return DD(r.hi, rest);
  return DD(r.hi * 4.0, rest * 4.0);
}

// Olver's expansion is used for nu >= kOlverMinOrder everywhere, and for
// kOlverLowOrder <= nu < kOlverMinOrder when z > nu.  Below that the Debye
// polynomials are evaluated too close to p = 1, where their large alternating
// coefficients cancel (the error of u_k(p) in float64 is ~ sum|coef| * eps, which
// divided by nu^k is harmless for nu >= 20 but not at nu = 12), and the power
// series converges quickly there instead.
constexpr double kOlverMinOrder = 20.0;
constexpr double kOlverLowOrder = 12.0;

VMF_INLINE double hankel_threshold(double nu) { return nu < 8.0 ? 25.0 : 50.0; }

// log I_nu(z) (scaled = false) or log(I_nu(z) e^{-z}) (scaled = true).
// Domain nu >= 0, z >= 0; NaN outside.  z = 0 gives 0 for nu = 0 and -inf otherwise;
// z = inf gives +inf (scaled: -inf).
VMF_INLINE double log_iv(double nu, double z, bool scaled) {
  if (is_nan(nu) || is_nan(z) || nu < 0.0 || z < 0.0) return NAN;
  if (is_inf(nu)) return is_inf(z) ? NAN : -INFINITY;
  if (z == 0.0) return nu == 0.0 ? 0.0 : -INFINITY;
  if (is_inf(z)) return scaled ? -INFINITY : INFINITY;
  DD r;
  if (nu >= kOlverMinOrder || (nu >= kOlverLowOrder && z > nu)) {
    r = log_iv_olver(nu, z, scaled);
  } else if (z <= hankel_threshold(nu)) {
    r = log_iv_series(nu, z);
    if (scaled) r = r - z;
  } else {
    r = log_iv_hankel(nu, z, scaled);
  }
  return dd::to_double(r);
}

// ---------------------------------------------------------------------------
// Ruiz-Antolin & Segura (2016) bounds and the papers' approximations.

// The bounds are evaluated in two ways that share their formulas:
//   * where bounds_fast_range holds -- the order in the theorem's domain, nu <= 2^500 and
//     z in [2^-500, 2^500], so that no square over- or underflows -- in double-double
//     (segura_b_dd, theorem4_b_dd): every sum there adds terms of one sign, so the result
//     is the formula correctly rounded but for about 2^-100 relative.  Near z = 0 and
//     z = inf the bounds are tight to well below an ulp of the ratio (both tend to
//     z / (2 nu) and to 1), and a plain double evaluation (five or six roundings, up to
//     3 ulp) then put an upper bound below the exact ratio by more than 2 ulp (theorem 4
//     at nu = 0.002, z = 1.4e-5).  No branch and no library call but fma and sqrt, so the
//     CPU block loop still vectorises (its AVX2 copy has fma).
//   * elsewhere (extreme magnitudes; nan, infinities and z = 0 are handled by the caller)
//     in double with hypot, so nothing over- or underflows (segura_b, theorem4_b):
//     within about 3 ulp of the formula.
// Both need 0 < z < inf and nu finite in the theorem's domain.
constexpr double kBoundsFastMin = 0x1p-500, kBoundsFastMax = 0x1p500;

// B_alpha(nu, z) = z / (delta + sqrt(delta^2 + z^2)),
// delta = (nu - 1/2) + lambda / (2 sqrt(lambda^2 + z^2)), lambda = nu + (alpha - 1)/2.
// (sqrt(lambda^2 + z^2) >= z > 0.)  Extreme magnitudes only (see above).
VMF_INLINE double segura_b(double nu, double z, double alpha) {
  const double lambda = nu + 0.5 * (alpha - 1.0);
  const double h = ::hypot(lambda, z);  // (inf near DBL_MAX: then lambda/(2h) -> 0, negligible)
  const double delta = (nu - 0.5) + lambda / (2.0 * h);
  // delta + sqrt(delta^2 + z^2) overflows near DBL_MAX (the bounds were 0 at nu = z = 1e308):
  // a quarter scale there (exact; R <= 1, so the quotient is at most 4).
  if (delta > kHugeArg || z > kHugeArg) return (z / (0.25 * delta + ::hypot(0.25 * delta, 0.25 * z))) * 0.25;
  return z / (delta + ::hypot(delta, z));
}

// The same in double-double, where no square over- or underflows.  nu >= 1/2 and
// alpha in {0, 2}, so lambda >= 0 and delta >= 0: no sum cancels.
VMF_INLINE double segura_b_dd(double nu, double z, double alpha) {
  const DD z2 = dd::two_prod(z, z);
  const DD lambda = dd::two_sum(nu, 0.5 * (alpha - 1.0));
  const DD h = dd::sqrt_positive(lambda * lambda + z2);
  const DD delta = dd::two_sum(nu, -0.5) + dd::div(lambda, DD(2.0 * h.hi, 2.0 * h.lo));
  return dd::to_double(dd::div(DD(z), delta + dd::sqrt_positive(delta * delta + z2)));
}

// Theorem 4's z / ((nu - c) + sqrt((nu + c)^2 + z^2)), c = 1/2 (lower) or 1 (upper).
// For nu < c the denominator cancels (to 0 once z^2 is below the rounding of (nu + c)^2: the
// lower bound was inf at nu = 0, z = 1e-9);
// there it is (4 c nu + z^2) / (sqrt((nu + c)^2 + z^2) + (c - nu)), all terms >= 0, so
// the bound is (h + c - nu) / (4 c nu / z + z), with z / (4 c nu) taken apart if 4 c nu / z
// overflows.  Extreme magnitudes only (see above).
VMF_INLINE double theorem4_b(double nu, double z, double c) {
  // as in segura_b: a quarter scale where (nu - c) + sqrt((nu + c)^2 + z^2) could overflow
  if (nu > kHugeArg || z > kHugeArg) return (z / (0.25 * (nu - c) + ::hypot(0.25 * (nu + c), 0.25 * z))) * 0.25;
  const double h = ::hypot(nu + c, z);
  if (nu >= c) return z / ((nu - c) + h);
  const double q = (4.0 * c * nu) / z;
  // (where q overflows z is tiny: multiply first, z / (4 c nu) alone rounded to 0 in the
  // subnormal range -- the upper bound was 0 below the lower at nu = 1/2, z = 5e-324)
  return !is_inf(q) ? (h + (c - nu)) / (q + z) : ((h + (c - nu)) * z) / (4.0 * c * nu);
}

// a where the mask is all ones, b where it is 0.
VMF_INLINE double select_bits(uint64_t mask, double a, double b) {
  return dd::from_bits((dd::bits(a) & mask) | (dd::bits(b) & ~mask));
}

// The same in double-double, where no square over- or underflows: for nu >= c the
// denominator (nu - c) + h, for nu < c the rationalised z (h + (c - nu)) / (4 c nu + z^2),
// all of whose sums add non-negative terms (4 c nu is exact: 4 c is 2 or 4).  Both forms
// are formed and one quotient taken, so that the block loop has no branch.
VMF_INLINE double theorem4_b_dd(double nu, double z, double c) {
  const DD z2 = dd::two_prod(z, z);
  const DD s = dd::two_sum(nu, c);
  const DD h = dd::sqrt_positive(s * s + z2);
  const DD num_small = (h + dd::two_sum(c, -nu)) * z, den_small = z2 + 4.0 * c * nu;
  const DD den_large = dd::two_sum(nu, -c) + h;
  // a select by bit mask: with a ?: GCC moved each form's arithmetic into a branch of its
  // own, and the loop no longer vectorised
  const uint64_t large = uint64_t{0} - static_cast<uint64_t>(nu >= c);
  const DD num(select_bits(large, z, num_small.hi), select_bits(large, 0.0, num_small.lo));
  const DD den(select_bits(large, den_large.hi, den_small.hi), select_bits(large, den_large.lo, den_small.lo));
  return dd::to_double(dd::div(num, den));
}

// bounds_fast_range: where the double-double forms apply.
template <int Theorem>
VMF_INLINE bool bounds_fast_range(double nu, double z) {
  const double lo_nu = Theorem == 5 ? 0.5 : 0.0;
  return (nu >= lo_nu) & (nu <= kBoundsFastMax) & (z >= kBoundsFastMin) & (z <= kBoundsFastMax);
}

template <bool InRange>
VMF_INLINE void bounds_formulas(double nu, double z, int theorem, double* lower, double* upper) {
  if (theorem == 5) {
    *lower = InRange ? segura_b_dd(nu, z, 2.0) : segura_b(nu, z, 2.0);
    *upper = InRange ? segura_b_dd(nu, z, 0.0) : segura_b(nu, z, 0.0);
  } else {
    *lower = InRange ? theorem4_b_dd(nu, z, 0.5) : theorem4_b(nu, z, 0.5);
    *upper = InRange ? theorem4_b_dd(nu, z, 1.0) : theorem4_b(nu, z, 1.0);
  }
}

// Theorem 5 (nu >= 1/2): B_2 < R < B_0.  Theorem 4 (nu >= 0):
//   z / (nu - 1/2 + sqrt((nu+1/2)^2 + z^2)) < R < z / (nu - 1 + sqrt((nu+1)^2 + z^2)).
// At z = 0 both bounds are 0, at z = inf both are 1; outside the theorem's domain NaN.
VMF_INLINE void iv_ratio_bounds(double nu, double z, int theorem, double* lower, double* upper) {
  const double lo_nu = theorem == 5 ? 0.5 : 0.0;
  if (is_nan(nu) || is_nan(z) || nu < lo_nu || z < 0.0 || is_inf(nu)) {
    *lower = *upper = (is_inf(nu) && nu > 0.0 && !is_inf(z) && z >= 0.0) ? 0.0 : NAN;
    return;
  }
  if (z == 0.0) {
    *lower = *upper = 0.0;
    return;
  }
  if (is_inf(z)) {
    *lower = *upper = 1.0;
    return;
  }
  const bool in_range = theorem == 5 ? bounds_fast_range<5>(nu, z) : bounds_fast_range<4>(nu, z);
  if (in_range) {
    bounds_formulas<true>(nu, z, theorem, lower, upper);
  } else {
    bounds_formulas<false>(nu, z, theorem, lower, upper);
  }
}

// iv_ratio_bounds where bounds_fast_range<Theorem>(nu, z) holds (garbage elsewhere).
template <int Theorem>
VMF_INLINE void iv_ratio_bounds_fast(double nu, double z, double* lower, double* upper) {
  bounds_formulas<true>(nu, z, Theorem, lower, upper);
}

// The papers' approximation R ~ (B_2 + B_0) / 2 (eq. 33).
VMF_INLINE double iv_ratio_approx(double nu, double z) {
  double lo, hi;
  iv_ratio_bounds(nu, z, 5, &lo, &hi);
  return 0.5 * (lo + hi);
}

// The papers' eq. (44): nu log z + eta z - (eta + nu) log 2 - log Gamma(nu+1) for z < nu
// (eta = (nu + 1/2) / (2 (nu + 1))), z - log(z)/2 - log(2 pi)/2 for z >= nu.
// nu = inf gives -inf for finite z (the limit of log I), z = inf gives +inf (finite nu).
// Beyond nu = 2^1000 the first branch is evaluated through Stirling's series,
//   nu (log(z / (2 nu)) + 1 + eta z / nu) - eta log 2 - log(2 pi nu)/2  (next term 1/(12 nu) < 2^-1000),
// since nu log z and log Gamma(nu + 1) overflow separately there (NaN before).
VMF_INLINE double log_iv_asymptotic(double nu, double z) {
  if (is_nan(nu) || is_nan(z) || nu < 0.0 || z < 0.0) return NAN;
  if (z == 0.0) return nu == 0.0 ? 0.0 : -INFINITY;
  if (is_inf(z)) return is_inf(nu) ? NAN : INFINITY;
  if (is_inf(nu)) return -INFINITY;
  if (z < nu) {
    double eta = (nu + 0.5) / (2.0 * (nu + 1.0));
    if (nu > kHugeArg) {
      const double q = z / nu;  // in (0, 1); log q directly unless it underflows
      const double log_q = q > 0x1p-1000 ? ::log(q) : ::log(z) - ::log(nu);
      return nu * ((log_q - dd::kLn2Hi + 1.0) + eta * q) - eta * dd::kLn2Hi - 0.5 * (dd::kLog2PiHi + ::log(nu));
    }
    return nu * ::log(z) + eta * z - (eta + nu) * dd::kLn2Hi - ::lgamma(nu + 1.0);
  }
  return z - 0.5 * ::log(z) - 0.5 * dd::kLog2PiHi;
}

// The papers' eq. (45): log I_{nu - floor(nu)}(z) + sum_{n=0}^{floor(nu)-1} log R_{nu-n}(z),
// each ratio by the approximation above, the fractional order exactly.  O(nu) work.
// Orders above kSeriesMaxOrder give NaN: the loop is O(nu) (a million terms take a few
// milliseconds; nu = 1e9 took minutes, and from 2^53 on the counter stops advancing).
constexpr double kSeriesMaxOrder = 0x1p20;

VMF_INLINE double log_iv_ratio_series(double nu, double z) {
  if (is_nan(nu) || is_nan(z) || nu < 0.0 || z < 0.0 || !(nu <= kSeriesMaxOrder)) return NAN;
  double n = ::floor(nu);
  double acc = log_iv(nu - n, z, false);
  // Below z = 2^-900 every factor is z / (2 (nu - j)) to relative 2^-800 (both bounds are, as
  // delta -> nu - j), so it is taken at z 2^500 (still in that linear range) and n 500 log 2
  // subtracted at the end: the factors stay normal where z / (2 nu) would be subnormal.
  const bool tiny = z < 0x1p-900;
  const double zs = tiny ? z * 0x1p500 : z;
  // The product is flushed into acc before it can leave the normal range: a factor below
  // 1e-140 goes to acc directly, otherwise prod >= 1e-140 and the factor >= 1e-140 keep the
  // product above 1e-280 (it underflowed to 0, log -inf, at nu = 143, z = 1.5e-118).
  double prod = 1.0;
  for (double j = 0.0; j < n; j += 1.0) {
    const double r = iv_ratio_approx(nu - j, zs);
    if (r < 1e-140) {
      acc += ::log(r);
      continue;
    }
    prod *= r;
    if (prod < 1e-140) {
      acc += ::log(prod);
      prod = 1.0;
    }
  }
  acc += ::log(prod);
  return tiny ? acc - n * (500.0 * dd::kLn2Hi) : acc;
}

}  // namespace bessel
}  // namespace vmfdist
