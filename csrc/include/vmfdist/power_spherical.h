// The power spherical distribution (De Cao & Aziz 2020): sampling and the implicit
// reparameterisation gradient of its marginal, written once for the CPU loops
// (csrc/cpu/power_spherical_cpu.cpp), the CUDA kernels (csrc/cuda/power_spherical_cuda.cu)
// and the elementwise op power_spherical_marginal_grad (elementwise.h).
//
// PS(mu, kappa) on S^{d-1} has density C (1 + mu^T x)^kappa.  With
//   alpha = (d - 1)/2 + kappa,  beta = (d - 1)/2,
// a variate is x = Q(mu) (t, sqrt(1 - t^2) v) with
//   * t = mu^T x = 2B - 1, B ~ Beta(alpha, beta), drawn as B = G1 / (G1 + G2) from
//     G1 ~ Gamma(alpha), G2 ~ Gamma(beta) (Marsaglia & Tsang 2000, with their squeeze;
//     shapes below 1 by G(a) = G(a + 1) U^{1/a}), so that
//       1 - t = 2 G2 / (G1 + G2),  1 + t = 2 G1 / (G1 + G2)
//     are both accurate to rounding (nothing cancels near the poles);
//   * v uniform on S^{d-2} and Q(mu) the reflection with Q e_1 = mu: exactly the vMF
//     sampler's (vmf.h: row_rotation), so only the marginal differs.
//
// Randomness (part of the reproducibility contract): sample row r (row-major over
// (num_samples, batch)) draws its marginal from the Philox stream (seed, offset, r) --
// G1 first, then G2; each Marsaglia-Tsang round takes one normal (both normals of a
// Box-Muller pair are used: the second normal of G1's last round starts G2) and one
// uniform -- and its tangent normals from the stream (seed, offset + 1, r), block j giving
// normals 4j .. 4j+3 as in vmf.h (fast_normal.h: float32 rows use the float Box-Muller).
//
// The gradient.  The rejection steps make G1 a discontinuous function of the noise, so the
// op does not differentiate through them; dt/dkappa is the implicit reparameterisation
// gradient -(dF/dkappa)/f of the marginal (Figurnov, Mohamed & Mnih 2018), which holds
// for any sampler of B.  It is computed in the logit s = log(B / (1 - B)), where the
// density p(s) ~ e^{alpha s} / (1 + e^s)^{alpha + beta} is smooth and log-concave on the
// whole line (no endpoint singularities, unlike B or the angle for d = 2):
//   d log p / d alpha = log B + D,  D = psi(alpha + beta) - psi(alpha) = -E[log B],
//   ds/dalpha = -int_{-inf}^{sigma} (log B + D) p(s)/p(sigma) ds = int_sigma^inf (...) ds,
//   dt/dkappa = 2 dB/dalpha = 2 B (1 - B) ds/dalpha,
// integrated over the side of sigma away from the mode (log(alpha/beta)), where
// p(s)/p(sigma) <= 1 decreases monotonically, truncated where it falls below e^{-30}:
// Gauss-Legendre panels in x = |s - sigma| (see kTailLog).  With h = s - sigma, c = 1 - B(sigma):
//   log p(sigma + h) - log p(sigma) = -alpha log1p(c expm1(-h)) - beta log1p(B expm1(h)),
//   log B(sigma + h) = log1p(-c) - log1p(c expm1(-h)),
// (and log1p(B expm1(h)) = h + log1p(c expm1(-h))), so for large kappa (c ~ beta / alpha) no
// term of order alpha cancels, and D is formed from Stirling's series for psi(a + b) - psi(a)
// without subtracting two digammas.
#pragma once

#include <cstdint>

#include "vmfdist/gauss_legendre.h"
#include "vmfdist/macros.h"
#include "vmfdist/philox.h"
#include "vmfdist/vec_math.h"
#include "vmfdist/vmf.h"

namespace vmfdist {
namespace power_spherical {

// ---- Sampling ----------------------------------------------------------------

// log1p(e) - e for e > -1, to a few ulp also for small |e|: with s = e / (2 + e),
// log1p(e) = 2 atanh(s), so log1p(e) - e = -e^2 / (2 + e) + 2 (s^3/3 + s^5/5 + ...)
// (the two parts have the same sign as -e^2 and e^3: no cancellation).  Used in
// Marsaglia-Tsang's test d (1 - v + log v) with v = 1 + e, whose direct form loses every
// digit for the huge shapes of a concentrated marginal (e ~ 1/sqrt(alpha)).
VMF_INLINE double log1p_minus(double e) {
  if (!(::fabs(e) < 0.125)) return ::log1p(e) - e;
  const double s = e / (2.0 + e), s2 = s * s;
  double term = s * s2, sum = 0.0;
  for (int k = 1; k <= 9; ++k) {  // |s| < 1/15: s^18 < 1e-21 relative to s^3
    sum += term / (2 * k + 1);
    term *= s2;
  }
  return -e * e / (2.0 + e) + 2.0 * sum;
}

// Standard normals for the Gamma draws, both members of each Box-Muller pair used in turn
// (uniforms drawn in between do not discard the second one, unlike PhiloxStream::next_normal).
struct NormalPairs {
  philox::PhiloxStream* s;
  double spare;
  bool has;
  VMF_HD double next() {
    if (has) {
      has = false;
      return spare;
    }
    double z0;
    s->next_normal_pair(&z0, &spare);
    has = true;
    return z0;
  }
};

// G ~ Gamma(a, 1) for a >= 1 by Marsaglia & Tsang (2000): G = (a - 1/3) v, v = (1 + c x)^3,
// c = 1 / sqrt(9 (a - 1/3)), x standard normal, accepted with their squeeze or
// log u < x^2/2 + (a - 1/3)(1 - v + log v).  NaN after vmf::kMaxRejections rounds (never for
// finite a >= 1: each round accepts with probability > 0.95).
VMF_INLINE double gamma_mt(NormalPairs& n, philox::PhiloxStream& s, double a) {
  const double dd = a - 1.0 / 3.0;
  const double c = 1.0 / ::sqrt(9.0 * dd);
  for (int it = 0; it < vmf::kMaxRejections; ++it) {
    const double x = n.next();
    const double cx = c * x;
    if (cx <= -1.0) continue;
    const double e = cx * (3.0 + cx * (3.0 + cx));  // v - 1, without rounding v first
    const double u = s.next_uniform<53>();
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * x2 * x2 || ::log(u) < 0.5 * x2 + dd * log1p_minus(e)) return dd * (1.0 + e);
  }
  return NAN;
}

// G ~ Gamma(a, 1) for a >= 1/2 (the shapes here are at least (d - 1)/2 >= 1/2):
// a < 1 by G(a + 1) U^{1/a}, the uniform drawn after the Gamma(a + 1) variate.
VMF_INLINE double gamma_sample(NormalPairs& n, philox::PhiloxStream& s, double a) {
  if (a >= 1.0) return gamma_mt(n, s, a);
  const double g = gamma_mt(n, s, a + 1.0);
  return g * ::pow(s.next_uniform<53>(), 1.0 / a);
}

// The marginal t = mu^T x with 1 - t and 1 + t (vmf::Marginal: w, omw, opw) from the row's
// stream s = (seed, offset, row); d >= 2.  kappa = +inf (or a G1 that overflows) is the
// point mass t = 1; kappa < 0 or NaN gives NaN.
VMF_INLINE vmf::Marginal sample_marginal(philox::PhiloxStream& s, double d, double kappa) {
  if (!(kappa >= 0.0)) return vmf::nan_marginal();
  vmf::Marginal out;
  const double beta = 0.5 * (d - 1.0);
  const double alpha = beta + kappa;
  double g1 = INFINITY, g2 = 0.0;
  if (!is_inf(alpha)) {
    NormalPairs n{&s, 0.0, false};
    g1 = gamma_sample(n, s, alpha);
    g2 = gamma_sample(n, s, beta);
    if (is_nan(g1) || is_nan(g2)) return vmf::nan_marginal();  // gave up (never for valid input)
  }
  if (is_inf(g1)) {
    out.w = 1.0;
    out.omw = 0.0;
    out.opw = 2.0;
    return out;
  }
  const double sum = g1 + g2;
  out.omw = 2.0 * g2 / sum;
  out.opw = 2.0 * g1 / sum;
  out.w = (g1 - g2) / sum;
  return out;
}

VMF_INLINE vmf::Marginal sample_marginal(uint64_t seed, uint64_t offset, uint64_t row, double d, double kappa) {
  philox::PhiloxStream s(seed, offset, row);
  return sample_marginal(s, d, kappa);
}

// ---- psi(a + b) - psi(a) -------------------------------------------------------

// psi(a + b) - psi(a) for a >= 10, b > 0, from psi(x) = log x - 1/(2x) - sum_k B_2k / (2k x^2k):
//   log1p(b/a) + b / (2 a (a + b)) + sum_k (B_2k / 2k) (a^-2k - (a + b)^-2k),
// seven terms (the first omitted one is below 1e-17 at a = 10).
VMF_INLINE double digamma_diff_large(double a, double b) {
  const double coef[7] = {1.0 / 12.0, -1.0 / 120.0, 1.0 / 252.0, -1.0 / 240.0, 1.0 / 132.0, -691.0 / 32760.0,
                          1.0 / 12.0};
  const double ia2 = 1.0 / (a * a), ib = 1.0 / (a + b), ib2 = ib * ib;
  double pa = ia2, pb = ib2, sum = 0.0;
  for (int k = 0; k < 7; ++k) {
    sum += coef[k] * (pa - pb);
    pa *= ia2;
    pb *= ib2;
  }
  return ::log1p(b / a) + 0.5 * b / a * ib + sum;
}

// D(a, b) = psi(a + b) - psi(a) > 0 for a, b > 0, to a few ulp of D (no two digammas are
// subtracted: for a < 10 the recurrence psi(x + 1) = psi(x) + 1/x gives
// D(a, b) = D(a + n, b) + sum_{k < n} b / ((a + k)(a + b + k))).
VMF_INLINE double digamma_diff(double a, double b) {
  double sum = 0.0;
  while (a < 10.0) {
    sum += b / (a * (a + b));
    a += 1.0;
  }
  return sum + digamma_diff_large(a, b);
}

// ---- dt/dkappa: the implicit reparameterisation gradient of the marginal -----------

// The integrand is cut where p(s)/p(sigma) < e^-30 (what is left beyond is below 1e-13 of the
// integral).  It is analytic in a strip of half-width pi around the real axis (the poles of
// log1p(B expm1(h)) lie at Im h = +-pi), so a Gauss-Legendre panel needs to be short against pi
// where the tail decays slowly: 2 panels [0, X/4], [X/4, X] of 16 nodes where the side's decay
// rate (beta towards +inf, alpha towards -inf) is at least 1, 3 panels [0, X/9], [X/9, 4X/9],
// [4X/9, X] otherwise (only for d = 2: towards +inf, and towards -inf when kappa < 1/2).  Worst
// relative error over d = 2 .. 3000 (d = 3 has the closed form below), kappa = 0 .. 1e9 and
// quantiles 1e-6 .. 1 - 1e-6: 6.3e-10 (d = 4; d = 2: 4.9e-11, d = 5: 1.2e-10, from d = 7 on
// below 1e-12; measured with the vectorised node loop and the Newton cut) against mpmath's
// derivative of the regularised incomplete beta function (tests/test_power_spherical.py).
// Cost a row: two or three expm1/log1p pairs for the cut (libm; the bracketing search it falls
// back to takes five to ten), then 32 (or 48) expm1/log1p/exp triples, 16 nodes at a time in a
// loop the CPU build vectorises (vec_math.h): about twice as fast as one libm call after another.
// (The CPU's fused backward takes 12-node panels for float32 results from d = 8 on, where their error,
// at most 1.03e-8, is below float32's rounding: power_spherical_cpu.cpp.)
VMF_CONSTANT double kTailLog = 30.0;

// The side of sigma away from the mode, in x = |s - sigma| >= 0.  With h = sign x and
// lc = log1p(c expm1(-h)) = log(B(sigma) / B(sigma + h)), the other logarithm of the log ratio is
// log1p(B expm1(h)) = h + lc, so
//   log p(sigma + h) - log p(sigma) = -(alpha + beta) lc - beta h,   log B(sigma + h) = log1p(-c) - lc:
// one expm1 and one log1p a point.  (Near the mode (alpha + beta) c ~ beta: the two terms, each
// of order beta h, cancel to order beta h^2, in absolute terms harmless for exp(g).)
struct LogitSide {
  double a, b, c, sign;  // alpha, beta, 1 - B(sigma); sign +1: towards +inf

  // g(x) = log p(sigma + h) - log p(sigma), and with slope its derivative in x: with em = expm1(-h),
  //   d lc / dh = -c (em + 1) / (1 + c em),   dg/dx = sign ((alpha + beta) c (em + 1) / (1 + c em) - beta).
  // (dt_dkappa_d's node loop evaluates the same g with vec_math.h's functions.)
  VMF_HD double log_ratio(double x, double* slope = nullptr) const {
    const double h = sign * x;
    const double em = ::expm1(-h);
    const double u = c * em;
    if (slope != nullptr) *slope = sign * ((a + b) * (c * (em + 1.0)) / (1.0 + u) - b);
    return -(a + b) * ::log1p(u) - b * h;
  }
};

// Where the log ratio g falls below -kTailLog (g is concave, g(0) = 0, decreasing on the
// side): a point where g lies in [-2 kTailLog, -kTailLog), by Newton's method from the scale
// x0 of the logit (sqrt(1/alpha + 1/beta)), or where that does not land there, by doubling or
// halving from x0 to bracket the crossing, then bisecting.
VMF_INLINE double tail_cut(const LogitSide& s) {
  const double x0 = ::sqrt(1.0 / s.a + 1.0 / s.b);
  // Newton's method on g(x) = -1.1 kTailLog from the logit's scale: g is concave, so after the
  // first step every iterate lies at or beyond the crossing and they approach it from there; two
  // or three evaluations usually land in the band (the search below took five to ten)
  {
    double x = x0;
    for (int it = 0; it < 8; ++it) {
      double slope;
      const double g = s.log_ratio(x, &slope);
      if (g < -kTailLog && g >= -2.0 * kTailLog) return x;
      if (!(slope < 0.0) || is_nan(g)) break;
      const double next = x + (-1.1 * kTailLog - g) / slope;
      if (!(next > 0.0) || is_inf(next)) break;
      x = next;
    }
  }
  // else: bracket by doubling or halving, then bisect
  double hi = x0;
  if (s.log_ratio(hi) < -kTailLog) {
    for (int it = 0; it < 1100 && s.log_ratio(0.5 * hi) < -kTailLog && hi > 1e-300; ++it) hi *= 0.5;
  } else {
    // each side's tail decays at least like e^{-min(alpha, beta) x} (min >= 1/2): this ends by
    // x ~ kTailLog / min(alpha, beta) + a few scales
    for (int it = 0; it < 1100 && !(s.log_ratio(hi) < -kTailLog); ++it) hi *= 2.0;
  }
  double lo = 0.5 * hi;
  for (int it = 0; it < 100; ++it) {
    const double g = s.log_ratio(hi);
    if (g >= -2.0 * kTailLog) break;
    const double mid = 0.5 * (lo + hi);
    if (!(mid > lo && mid < hi)) break;
    if (s.log_ratio(mid) < -kTailLog) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

// d = 3 (beta = 1) in closed form: B ~ Beta(alpha, 1) has F(B) = B^alpha, so
//   dB/dalpha = -(dF/dalpha) / f = -B log B / alpha,   dt/dkappa = -2 B log(B) / alpha,
// with B = 1 - omw/2 (exact where omw >= 1, i.e. wherever B is small) and log B = log1p(-omw/2):
// a few ulp, for the cost of one log1p instead of the quadrature.
VMF_INLINE double dt_dkappa_sphere3(double omw, double kappa) {
  const double c = 0.5 * omw;
  return -2.0 * (1.0 - c) * ::log1p(-c) / (1.0 + kappa);
}

// The Gauss-Legendre rule of a panel, by its number of nodes: 16, or 12 (see dt_dkappa_d).
template <int N>
struct PanelRule;
template <>
struct PanelRule<16> {
  static constexpr int half = gauss_legendre::kGL16Half;
  VMF_HD static double node(int i) { return gauss_legendre::kGL16Node[i]; }
  VMF_HD static double weight(int i) { return gauss_legendre::kGL16Weight[i]; }
};
template <>
struct PanelRule<12> {
  static constexpr int half = gauss_legendre::kGL12Half;
  VMF_HD static double node(int i) { return gauss_legendre::kGL12Node[i]; }
  VMF_HD static double weight(int i) { return gauss_legendre::kGL12Weight[i]; }
};

// dt/dkappa at 1 - t = omw for PS(., kappa) on S^{d-1}, with D = psi(alpha + beta) - psi(alpha)
// given (a caller with many rows of one kappa can compute it once; dt_dkappa computes it), with
// Nodes Gauss-Legendre nodes a panel (PanelRule).  0 at the poles (omw = 0 or 2) and for
// kappa = +inf; NaN outside the domain.
template <int Nodes = 16>
VMF_INLINE double dt_dkappa_d(double omw, double kappa, double d, double dg) {
  if (is_nan(omw) || is_nan(kappa) || is_nan(d) || kappa < 0.0 || d < 2.0 || omw < 0.0 || omw > 2.0) return NAN;
  if (omw == 0.0 || omw == 2.0 || is_inf(kappa)) return 0.0;
  if (d == 3.0) return dt_dkappa_sphere3(omw, kappa);
  LogitSide s;
  s.b = 0.5 * (d - 1.0);
  s.a = s.b + kappa;
  s.c = 0.5 * omw;
  // sigma at or above the mode log(alpha / beta) <=> B >= alpha / (alpha + beta)
  s.sign = s.c * (s.a + s.b) <= s.b ? 1.0 : -1.0;
  const double l0 = ::log1p(-s.c) + dg;  // log B(sigma) + D
  const double cut = tail_cut(s);
  const int panels = (s.sign > 0.0 ? s.b : s.a) < 1.0 ? 3 : 2;
  // The nodes of a panel in the order -x_0, +x_0, -x_1, ...: their terms are independent, computed
  // with vecmath's branch-free functions in one loop the CPU build vectorises (three libm calls a
  // node, one node at a time, were most of a row's cost), then added in that order.
  using Rule = PanelRule<Nodes>;
  constexpr int kNodes = 2 * Rule::half;
  double off[kNodes], wt[kNodes], term[kNodes];
  for (int i = 0; i < Rule::half; ++i) {
    off[2 * i] = -Rule::node(i);
    off[2 * i + 1] = Rule::node(i);
    wt[2 * i] = wt[2 * i + 1] = Rule::weight(i);
  }
  const double ab = s.a + s.b;
  double sum = 0.0, lo = 0.0;
  for (int k = 1; k <= panels; ++k) {
    const double q = static_cast<double>(k) / panels;
    const double hi = cut * q * q;
    const double half = 0.5 * (hi - lo), mid = 0.5 * (hi + lo);
    VMF_SIMD_LOOP
    for (int j = 0; j < kNodes; ++j) {
      // LogitSide::log_ratio at x = mid + off[j] half
      const double h = s.sign * (mid + off[j] * half);
      const double lc = vecmath::log1p(s.c * vecmath::expm1(-h));
      term[j] = wt[j] * (l0 - lc) * vecmath::exp(-ab * lc - s.b * h);
    }
    double panel = 0.0;
    for (int j = 0; j < kNodes; ++j) panel += term[j];
    sum += half * panel;
    lo = hi;
  }
  // ds/dalpha = sign * int_0^X (log B + D) p / p(sigma) dx; dt/dkappa = 2 B (1 - B) ds/dalpha
  return 2.0 * (1.0 - s.c) * s.c * s.sign * sum;
}

VMF_INLINE double dt_dkappa(double omw, double kappa, double d) {
  if (is_nan(omw) || is_nan(kappa) || is_nan(d) || kappa < 0.0 || d < 2.0 || omw < 0.0 || omw > 2.0) return NAN;
  if (omw == 0.0 || omw == 2.0 || is_inf(kappa)) return 0.0;
  if (d == 3.0) return dt_dkappa_sphere3(omw, kappa);
  const double beta = 0.5 * (d - 1.0);
  return dt_dkappa_d(omw, kappa, d, digamma_diff(beta + kappa, beta));
}

}  // namespace power_spherical
}  // namespace vmfdist
