// von Mises-Fisher sampling and its implicit reparameterisation gradient, written
// once for the CPU loops (csrc/cpu/vmf_cpu.cpp) and the CUDA kernels
// (csrc/cuda/vmf_cuda.cu).
//
// A vMF(mu, kappa) variate on S^{d-1} is x = Q(mu) (w, sqrt(1 - w^2) v) with
//   * w = mu^T x, the marginal, density  f(w) ~ exp(kappa w) (1 - w^2)^{(d-3)/2} on [-1, 1],
//     drawn by Wood's (1994) rejection sampler (d != 3) or by the inverse CDF (d = 3);
//   * v uniform on S^{d-2}: d - 1 standard normals divided by their norm;
//   * Q(mu) an orthogonal reflection with Q e_1 = mu (see rotate_row).
// The marginal is carried as 1 - w (and 1 + w) so that nothing cancels near the
// poles; 1 - w is what the op returns for the backward pass.
//
// Randomness (part of the reproducibility contract): sample row r (row-major over
// (num_samples, batch)) draws its marginal from the Philox stream (seed, offset, r)
// and its tangent normals from the stream (seed, offset + 1, r): block j of that
// stream gives normals 4j .. 4j+3 (two Box-Muller pairs; float32 samples use the
// float Box-Muller, other dtypes the double one: fast_normal.h), so any thread
// layout reproduces the same row.
#pragma once

#include <cstdint>

#include "vmfdist/bessel.h"
#include "vmfdist/gauss_legendre.h"
#include "vmfdist/macros.h"
#include "vmfdist/philox.h"

namespace vmfdist {
namespace vmf {

VMF_CONSTANT double kPi = 3.14159265358979323846264338327950288;

// The marginal w with its distances to the poles, each accurate to rounding.
struct Marginal {
  double w, omw, opw;  // w, 1 - w, 1 + w
};

// A row of NaN: what the sampler returns for kappa < 0 or NaN (the op cannot rely on
// argument validation, which torch.compile switches off; before, kappa = -1e10 made
// Wood's acceptance test NaN forever, and NaN kappa returned loc or uniform samples).
VMF_INLINE Marginal nan_marginal() {
  Marginal out;
  out.w = out.omw = out.opw = NAN;
  return out;
}

// Rejection rounds after which a marginal is given up as NaN.  Wood's envelope and
// Marsaglia-Tsang's Gamma sampler accept with probability bounded away from 0 for every
// d and kappa >= 0, so 2^16 rounds are never reached by valid input; the cap only
// guarantees termination should a non-finite value ever reach the loops.
constexpr int kMaxRejections = 1 << 16;

// z ~ Beta(a, a) for a >= 1, with z' = 1 - z, from one Gamma and one normal: if
// T ~ Student-t with 2a degrees of freedom then (1 + T / sqrt(2a + T^2)) / 2 ~
// Beta(a, a), and with T = N sqrt(a / G), G ~ Gamma(a), N ~ N(0, 1) independent,
//   z = (s + N) / (2s),  z' = (s - N) / (2s),  s = sqrt(2G + N^2),
// where the difference s -+ N is rewritten as 2G / (s +- N) so neither z nor z'
// cancels.  G is drawn by Marsaglia & Tsang (2000) with their squeeze; N is the
// Box-Muller partner of the normal of G's accepted round (independent of it).
// Half the transcendental work of the usual G1 / (G1 + G2).
VMF_INLINE void beta_symmetric(philox::PhiloxStream& s, double a, double* z, double* zc) {
  const double dd = a - 1.0 / 3.0;
  const double c = 1.0 / ::sqrt(9.0 * dd);
  double g = NAN, nn = 0.0;
  for (int it = 0; it < kMaxRejections; ++it) {
    double x;
    s.next_normal_pair(&x, &nn);
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = s.next_uniform<53>();
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * x2 * x2 || ::log(u) < 0.5 * x2 + dd * (1.0 - v + ::log(v))) {
      g = dd * v;
      break;
    }
  }
  const double sq = ::sqrt(2.0 * g + nn * nn);
  if (nn >= 0.0) {
    *z = (sq + nn) / (2.0 * sq);
    *zc = g / (sq * (sq + nn));
  } else {
    *zc = (sq - nn) / (2.0 * sq);
    *z = g / (sq * (sq - nn));
  }
}

// Wood's envelope for dimension d = m + 1 and concentration kappa:
//   b = m / (2 kappa + sqrt(4 kappa^2 + m^2))   (no cancellation for any kappa),
//   x0 = (1 - b) / (1 + b),  1 - x0 = 2b / (1 + b),  1 - x0^2 = 4b / (1 + b)^2.
struct Wood {
  double kappa, m, b, x0, omx0, omx0sq;
};

VMF_INLINE Wood wood_setup(double d, double kappa) {
  Wood p;
  p.kappa = kappa;
  p.m = d - 1.0;
  p.b = p.m / (2.0 * kappa + ::hypot(2.0 * kappa, p.m));
  const double opb = 1.0 + p.b;
  p.x0 = (1.0 - p.b) / opb;
  p.omx0 = 2.0 * p.b / opb;
  p.omx0sq = 4.0 * p.b / (opb * opb);
  return p;
}


// One marginal by Wood's rejection sampler (d != 3; kappa finite, b > 0).
// Proposal: z ~ Beta(m/2, m/2), w = (1 - (1+b) z) / (1 - (1-b) z); with z' = 1 - z
// the denominator is z' + b z and 1 - w = 2bz / (z' + bz), 1 + w = 2z' / (z' + bz).
// Accept when kappa (w - x0) + m log(1 - x0 (w - x0) / (1 - x0^2)) >= log u, which is
// Wood's test kappa w + m log(1 - x0 w) - c >= log u rearranged to avoid cancellation.
VMF_INLINE Marginal wood_sample(philox::PhiloxStream& s, const Wood& p) {
  const double a = 0.5 * p.m;
  for (int it = 0; it < kMaxRejections; ++it) {
    double z, zc;
    if (a == 0.5) {  // d = 2: Beta(1/2, 1/2) is the arcsine law, z = sin^2(pi u / 2)
      const double t = 0.5 * kPi * s.next_uniform<53>();
      const double sn = ::sin(t), cs = ::cos(t);
      z = sn * sn;
      zc = cs * cs;
    } else {
      beta_symmetric(s, a, &z, &zc);
      if (is_nan(z)) return nan_marginal();  // the Gamma draw gave up (never for valid input)
    }
    const double den = zc + p.b * z;
    Marginal out;
    out.omw = 2.0 * p.b * z / den;
    out.opw = 2.0 * zc / den;
    out.w = (zc - p.b * z) / den;
    const double t = p.omx0 - out.omw;  // w - x0
    const double u = s.next_uniform<53>();
    const double expo = p.kappa * t + p.m * ::log1p(-p.x0 * t / p.omx0sq);
    // log u <= u - 1: most acceptances need no logarithm
    if (u - 1.0 <= expo || expo >= ::log(u)) return out;
  }
  return nan_marginal();
}

// d = 3: the exact inverse CDF, 1 - w = -log(1 - u (1 - e^{-2 kappa})) / kappa.
VMF_INLINE Marginal sphere3_sample(philox::PhiloxStream& s, double kappa) {
  const double u = s.next_uniform<53>();
  double omw = kappa > 0.0 ? -::log1p(u * ::expm1(-2.0 * kappa)) / kappa : 2.0 * u;
  omw = omw < 0.0 ? 0.0 : (omw > 2.0 ? 2.0 : omw);
  Marginal out;
  out.omw = omw;
  out.opw = 2.0 - omw;
  out.w = 1.0 - omw;
  return out;
}

// The marginal of a row from its stream s = (seed, offset, row), with p =
// wood_setup(d, kappa) (unused for d = 3): callers with many rows of one kappa compute it
// once.  kappa = +inf (or so large that b underflows) gives the point mass at w = 1.
VMF_INLINE Marginal sample_marginal(philox::PhiloxStream& s, double d, double kappa, const Wood& p) {
  if (!(kappa >= 0.0)) return nan_marginal();  // kappa < 0 or NaN (-inf included)
  if (d == 3.0) return sphere3_sample(s, kappa);
  if (!(p.b > 0.0)) {
    Marginal out;
    out.w = 1.0;
    out.omw = 0.0;
    out.opw = 2.0;
    return out;
  }
  return wood_sample(s, p);
}

VMF_INLINE Marginal sample_marginal(uint64_t seed, uint64_t offset, uint64_t row, double d, double kappa) {
  philox::PhiloxStream s(seed, offset, row);
  return sample_marginal(s, d, kappa, wood_setup(d, kappa));
}

// Normalising loc.  The kernels accumulate |mu|^2 (and mu.e) in double over the row; where
// that leaves [2^-960, 2^960] (an entry above ~2^480, or every entry below ~2^-480:
// loc = [1e300, 1e300, 0, 0] gave non-unit samples, loc = [1e-200, 0, ...] NaN), they redo
// the sums over mu_i s with the exact power of two s = loc_scale(max_i |mu_i|), and use
// mu_i s wherever mu_i appears.  Zero, infinite or NaN loc keeps s = 1 (and gives NaN rows).
VMF_INLINE bool loc_needs_scaling(double mm) { return !(mm >= 0x1p-960 && mm <= 0x1p960); }

VMF_INLINE double loc_scale(double max_abs) {
  if (!(max_abs > 0.0) || is_inf(max_abs)) return 1.0;
  const int e = ::ilogb(max_abs);  // max_abs in [2^e, 2^(e+1)); e >= -1074
  return ::ldexp(1.0, e < -1023 ? 1023 : -e);
}

// The reflection Q(mu) with Q e_1 = mu for unit mu (mu_0 its first entry):
//   mu_0 >= 0:  Q = -(I - 2 u u^T), u = (e_1 + mu) / |e_1 + mu|,
//   mu_0 <  0:  Q =   I - 2 u u^T,  u = (e_1 - mu) / |e_1 - mu|,
// so the normaliser |e_1 +- mu|^2 = 2 (1 + |mu_0|) >= 2 never cancels (mu = +-e_1
// included).  Both are symmetric and involutive (Q^{-1} = Q).  With
//   sgn = -1 (mu_0 >= 0) or +1,  den = 1 + |mu_0|,
//   sigma = y_0 den - sgn sum_{i>=1} mu_i y_i,
// Q y has entries  (Q y)_0 = sgn (y_0 - sigma),  (Q y)_i = sgn y_i + mu_i sigma / den.
struct Reflection {
  double sgn, den;
};

VMF_INLINE Reflection reflection(double mu0) {
  Reflection r;
  r.sgn = mu0 >= 0.0 ? -1.0 : 1.0;
  r.den = 1.0 + ::fabs(mu0);
  return r;
}

// ---- Row set-up of the reflection (shared by csrc/cpu/vmf_cpu.cpp and csrc/cuda/vmf_cuda.cu) ----
// One sample row x = Q(mu/|mu|) (w, s e / |e|), s = sqrt(1 - w^2) = sqrt(omw opw), from the
// tangent normals e (d - 1 entries) and the unnormalised loc mu, given the row's sums
//   ee = sum_{i>=1} e_i^2,  me = sum_{i>=1} mu_i e_i,  mm = sum_{i>=0} mu_i^2
// (mu is normalised on the fly, so loc that is unit only to rounding is fine).  Then
//   x_0 = x0,  x_i = sy e_i + c mu_i  (i >= 1),
// with y = (w, s e/|e|) and sigma = w den - sgn (s/|e|) (mu.e)/|mu| as in Reflection.
struct RowRotation {
  double x0, sy, c;
};

VMF_INLINE RowRotation row_rotation(double w, double omw, double opw, double ee, double me, double mm, double mu0) {
  const double inv_mu = 1.0 / ::sqrt(mm);
  const double scale = ::sqrt(omw * opw) / ::sqrt(ee);  // y_i = scale e_i
  const Reflection r = reflection(mu0 * inv_mu);
  const double sigma = w * r.den - r.sgn * scale * me * inv_mu;
  RowRotation t;
  t.x0 = r.sgn * (w - sigma);
  t.sy = r.sgn * scale;
  t.c = sigma / r.den * inv_mu;  // sigma / den, times the normalisation of mu_i
  return t;
}

// ---- The backward of vmf_sample (csrc/cpu/vmf_cpu.cpp, csrc/cuda/vmf_cuda.cu) ----
// With the unrotated sample y = Q(mu) x held fixed (Q is its own inverse) and mu = loc/|loc|,
// write Q(mu) = sgn (I - v v^T / den) with v = e_1 - sgn mu (v_0 = den = 1 + |mu_0|,
// v_i = -sgn mu_i, |v|^2 = 2 den).  For the gradient g of one sample row x:
//   d(g.x)/dmu  = (g (v.y) + y (g.v)) / den - e_1 (g.v)(v.y) / den^2,   v.y = -sgn v.x,
// and the marginal w = y_0 moves with kappa along (w, sqrt(1 - w^2) t), t fixed:
//   d(g.x)/dw   = (Q g)_0 - w sum_{i>=1} (Q g)_i y_i / (1 - w^2)     (0 where 1 - w^2 = 0),
// times dw/dkappa (dw_dkappa below).  Per row, from vx = v.x and vg = v.g, with
// a = vx / den and q = vg / den:  y_0 = sgn (x_0 - vx), y_i = sgn x_i + mu_i a,
// (Q g)_0 = sgn (g_0 - vg), (Q g)_i = sgn g_i + mu_i q  (i >= 1), and the row adds
//   -sgn a g_i + q y_i  to the mu-gradient (plus sgn a q at i = 0).
// Finally d/dloc = (I - mu mu^T) (d/dmu) / |loc|.  (vmfdist/_ops/vmf.py writes the same map
// with autograd for the double backward.)

// Per batch row: mu_i = loc_i * f (f = 1/|loc|, with the scaling of loc_needs_scaling),
// the reflection's sign and den.
struct LocFrame {
  double f, sgn, den;
};

VMF_INLINE LocFrame loc_frame(double mm_scaled, double loc_scale, double loc0) {
  LocFrame t;
  t.f = loc_scale / ::sqrt(mm_scaled);
  const Reflection r = reflection(loc0 * t.f);
  t.sgn = r.sgn;
  t.den = r.den;
  return t;
}

// v.e for e = x or g, given e_0 and sum_{i>=1} mu_i e_i.
VMF_INLINE double v_dot(const LocFrame& t, double e0, double mu_dot_tail) {
  return t.den * e0 - t.sgn * mu_dot_tail;
}

// The coefficients of one row: a = v.x / den, q = v.g / den, y_0 and (Q g)_0.
struct RowBackward {
  double a, q, y0, gq0;
};

VMF_INLINE RowBackward row_backward(const LocFrame& t, double x0, double g0, double vx, double vg) {
  RowBackward r;
  r.a = vx / t.den;
  r.q = vg / t.den;
  r.y0 = t.sgn * (x0 - vx);
  r.gq0 = t.sgn * (g0 - vg);
  return r;
}

// d(g.x)/dw from (Q g)_0, tang = sum_{i>=1} (Q g)_i y_i and 1 - w; minus the gradient of
// the op's second output 1 - w.
VMF_INLINE double marginal_dl_dw(double gq0, double tang, double omw, double grad_omw) {
  const double one_m_w2 = omw * (2.0 - omw);
  const double t = one_m_w2 > 0.0 ? (1.0 - omw) * tang / one_m_w2 : 0.0;
  return gq0 - t - grad_omw;
}

// ---------------------------------------------------------------------------
// Implicit reparameterisation of the marginal (Figurnov, Mohamed & Mnih 2018).
//
// In the angle phi = arccos(w) the marginal has density p(phi) ~ exp(kappa cos phi)
// sin^{d-2}(phi) on [0, pi] (analytic at both ends, for every d >= 2), unimodal with
// its mode at cos phi* = 2 kappa / ((d-2) + sqrt((d-2)^2 + 4 kappa^2)).  With
// theta = arccos(w), A = A_d(kappa) = E[cos phi] = I_{d/2}(kappa) / I_{d/2-1}(kappa):
//   dw/dkappa = sin(theta) int_0^theta (cos phi - A) p(phi)/p(theta) dphi
//             = -sin(theta) int_theta^pi (cos phi - A) p(phi)/p(theta) dphi.
// We integrate over the side away from the mode, where p(phi)/p(theta) <= 1 decreases
// monotonically away from theta, truncated where it falls below e^{-kTailLog}:
// x = |phi - theta| in [0, X], 2 Gauss-Legendre panels with breakpoints X/4, X
// (worst relative error 1.8e-8 over the slow sweep of tests/test_vmf.py; 4 panels: 2e-11).
// Everything is in log space; cos phi - cos theta = -2 sin((phi+theta)/2)
// sin((phi-theta)/2) and cos phi - A = (1 - A) - 2 sin^2(phi/2), with 1 - A from the
// complemented ratio, so nothing cancels for large kappa.
VMF_CONSTANT double kTailLog = 45.0;
constexpr int kPanels = 2;

struct AngleSide {
  double kappa, m2, theta, sign, log_sin_theta;  // sign: -1 towards 0, +1 towards pi

  // log p(theta + sign x) - log p(theta)
  VMF_HD double log_ratio(double x) const {
    const double phi = theta + sign * x;
    const double dcos = -2.0 * ::sin(theta + 0.5 * sign * x) * ::sin(0.5 * sign * x);
    double g = kappa * dcos;
    if (m2 != 0.0) g += m2 * (::log(::sin(phi)) - log_sin_theta);
    return g;
  }
};

// Where log p falls to -kTailLog on the side (or the end of the side, if it never does).
VMF_INLINE double tail_cut(const AngleSide& s, double xmax) {
  if (!(s.log_ratio(xmax) < -kTailLog)) return xmax;  // d = 2 towards pi, or a flat side
  // g is decreasing on [0, xmax]: bisect, geometrically first (the scale can be tiny),
  // until g lands in [-2 kTailLog, -kTailLog].
  double lo = 0.0, hi = xmax;
  for (int it = 0; it < 200; ++it) {
    const double x = (lo > 0.0 && hi > 4.0 * lo) ? ::sqrt(lo * hi) : (lo == 0.0 ? hi * 0x1p-8 : 0.5 * (lo + hi));
    if (x <= lo || x >= hi) break;
    const double g = s.log_ratio(x);
    if (g < -2.0 * kTailLog) {
      hi = x;
    } else if (g > -kTailLog) {
      lo = x;
    } else {
      return x;
    }
  }
  return hi;
}

// c = 1 - A_d(kappa) = bessel::iv_ratio(d / 2, kappa, true), which callers with many rows
// of one kappa compute once (dw_dkappa_c); dw_dkappa computes it.
VMF_INLINE double dw_dkappa_c(double omw, double kappa, double d, double c) {
  if (is_nan(omw) || is_nan(kappa) || is_nan(d) || kappa < 0.0 || d < 2.0 || omw < 0.0 || omw > 2.0) return NAN;
  if (omw == 0.0 || omw == 2.0 || is_inf(kappa)) return 0.0;
  const double m2 = d - 2.0;
  const double theta = omw < 0.5 ? 2.0 * ::asin(::sqrt(0.5 * omw)) : ::acos(1.0 - omw);
  double cmode = 1.0;  // cos of the mode (d = 2, or the uniform circle)
  if (m2 > 0.0) cmode = 2.0 * kappa / (m2 + ::hypot(m2, 2.0 * kappa));
  const double w = 1.0 - omw;
  AngleSide s;
  s.kappa = kappa;
  s.m2 = m2;
  s.theta = theta;
  s.log_sin_theta = ::log(::sin(theta));
  s.sign = w >= cmode ? -1.0 : 1.0;  // w above the mode: integrate over [0, theta]
  const double xmax = s.sign < 0.0 ? theta : kPi - theta;
  const double cut = tail_cut(s, xmax);
  double sum = 0.0;
  double a = 0.0;
  for (int k = 1; k <= kPanels; ++k) {
    const double q = static_cast<double>(k) / kPanels;
    const double bnd = cut * q * q;
    const double half = 0.5 * (bnd - a), mid = 0.5 * (bnd + a);
    double panel = 0.0;
    for (int i = 0; i < gauss_legendre::kGL16Half; ++i) {
      for (int pm = -1; pm <= 1; pm += 2) {
        const double x = mid + pm * half * gauss_legendre::kGL16Node[i];
        const double sh = ::sin(0.5 * (theta + s.sign * x));
        const double f = (c - 2.0 * sh * sh) * ::exp(s.log_ratio(x));
        panel += gauss_legendre::kGL16Weight[i] * f;
      }
    }
    sum += half * panel;
    a = bnd;
  }
  return -s.sign * ::sin(theta) * sum;
}

VMF_INLINE double dw_dkappa(double omw, double kappa, double d) {
  if (is_nan(omw) || is_nan(kappa) || is_nan(d) || kappa < 0.0 || d < 2.0 || omw < 0.0 || omw > 2.0) return NAN;
  if (omw == 0.0 || omw == 2.0 || is_inf(kappa)) return 0.0;
  return dw_dkappa_c(omw, kappa, d, bessel::iv_ratio(0.5 * d, kappa, true));
}

}  // namespace vmf
}  // namespace vmfdist
