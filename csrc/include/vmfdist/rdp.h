// The KL of one grouping of a radial--directional (RDP) layer (vmfdist.nn.rdp, Oh et al. 2019)
// and its gradient, written once for the CPU loop (csrc/cpu/rdp_cpu.cpp) and the CUDA kernel
// (csrc/cuda/rdp_cuda.cu).  A grouping has G groups of dimension d, one posterior concentration
// kappa_q = exp(log_kappa) for all of them, and G + 1 radius factors (G local, one global), each
// z^2 = a b with log-normal posteriors for a and b:
//
//   KL = G KL(vMF(kappa_q) || vMF(kappa_p))               (same mean direction; or || uniform)
//      + sum_{j <= G} [KL(LogNormal(m_a, s_a) || Gamma(1/2, rate beta_j))
//                      + KL(LogNormal(m_b, s_b) || InverseGamma(1/2, 1))]
//
// with s = softplus(rho), beta_j = 1/tau_local^2 for the local factors and 1/tau_global^2 for
// the global one.  Per factor (sign +1, beta for a; sign -1, beta = 1 for b), with
// E = beta exp(sign m + s^2/2):
//
//   KL = -1/2 log beta + log Gamma(1/2) - sign m / 2 + E - 1/2 log(2 pi e) - log s,
//   d/dm = sign (E - 1/2),   d/drho = (E s - 1/s) sigmoid(rho).
//
// The vMF part with L(kappa) = log C_d(kappa) + kappa (the scaled log normaliser) and
// c = 1 - A_d(kappa_q):  L(kappa_q) - L(kappa_p) - kappa_q c + kappa_p c  (uniform prior:
// L(kappa_q) - kappa_q c + log S_{d-1}), and d/dlog_kappa of G times it is
// G kappa_q (kappa_q - kappa_p) A_d'(kappa_q)  (uniform: G kappa_q^2 A_d'(kappa_q)).
// Everything in double.  The layout of the radius parameters: rows (m_a, m_b, rho_a, rho_b).
#pragma once

#include <cmath>
#include <cstdint>

#include "vmfdist/bessel.h"
#include "vmfdist/macros.h"
#include "vmfdist/meanfield.h"

namespace vmfdist {
namespace rdp {

constexpr double kLogGammaHalf = 0.57236494292470008707;   // log Gamma(1/2) = log(pi) / 2
constexpr double kHalfLog2PiE = 1.41893853320467274178;    // log(2 pi e) / 2
constexpr double kLog2Pi = 1.83787706640934548356;         // log(2 pi)
constexpr double kLogPi = 1.14472988584940017414;          // log(pi)
constexpr double kLog2 = 0.69314718055994530942;           // log(2)

// One log-normal factor's KL term and its derivatives (m, rho): sign +1 with log_beta = log of the
// Gamma prior's rate (the a factors), sign -1 with log_beta = 0 (the b factors).
struct Term {
  double kl, g_m, g_rho;
};

VMF_INLINE Term lognormal_term(double m, double rho, double sign, double beta, double log_beta) {
  const meanfield::Scale<double> q = meanfield::scale_of<double>(rho);
  // log s, also where s underflows (rho far below 0: s = e^rho (1 - e^rho / 2 + ...))
  const double log_s = rho < meanfield::Small<double>::kRho ? rho - 0.5 * q.t : ::log(q.sigma);
  const double e = beta * ::exp(sign * m + 0.5 * q.sigma * q.sigma);
  Term r;
  r.kl = -0.5 * log_beta + kLogGammaHalf - 0.5 * sign * m + e - kHalfLog2PiE - log_s;
  r.g_m = sign * (e - 0.5);
  r.g_rho = rho < meanfield::Small<double>::kRho ? (e * q.sigma) * q.sigmoid - (1.0 - 0.5 * q.t)
                                                 : (e * q.sigma - 1.0 / q.sigma) * q.sigmoid;
  return r;
}

// One radius factor: its parameters at p[0], p[stride], p[2 stride], p[3 stride] (m_a, m_b,
// rho_a, rho_b), its two terms' KL returned and their four derivatives written to o at the same
// offsets.  beta, log_beta: the Gamma prior's rate of the a factor (1 / tau^2) and its log.
template <typename scalar_t>
VMF_INLINE double radius_factor(const scalar_t* p, scalar_t* o, int64_t stride, double beta, double log_beta) {
  const Term a = lognormal_term(static_cast<double>(p[0]), static_cast<double>(p[2 * stride]), 1.0, beta, log_beta);
  const Term b = lognormal_term(static_cast<double>(p[stride]), static_cast<double>(p[3 * stride]), -1.0, 1.0, 0.0);
  o[0] = static_cast<scalar_t>(a.g_m);
  o[stride] = static_cast<scalar_t>(b.g_m);
  o[2 * stride] = static_cast<scalar_t>(a.g_rho);
  o[3 * stride] = static_cast<scalar_t>(b.g_rho);
  return a.kl + b.kl;
}

VMF_INLINE double log_sphere_area(double d) { return kLog2 + 0.5 * d * kLogPi - ::lgamma(0.5 * d); }

// log C_d(kappa) + kappa; NaN for kappa < 0 or NaN.  Below kappa = 2^-20 the series
// -log S_{d-1} + kappa - kappa^2 / (4 (nu + 1)) (nu = d/2 - 1), as the Python reference.
VMF_INLINE double log_normalizer_scaled(double kappa, double d) {
  if (!(kappa >= 0.0)) return NAN;
  const double nu = 0.5 * d - 1.0;
  if (kappa < 0x1p-20) return -log_sphere_area(d) + (kappa - kappa * kappa / (4.0 * (nu + 1.0)));
  return nu * ::log(kappa) - 0.5 * d * kLog2Pi - bessel::log_iv(nu, kappa, true);
}

// The directions' part: G times the vMF KL, and its derivative in log kappa_q.
struct Directions {
  double kl, g_log_kappa;
};

VMF_INLINE Directions directions(double log_kappa, double kappa_p, double d, double groups, bool uniform) {
  const double kq = ::exp(log_kappa);
  const double c = kq >= 0.0 && !is_inf(kq) ? bessel::iv_ratio(0.5 * d, kq, true) : NAN;
  const double lq = log_normalizer_scaled(kq, d);
  const double one = uniform ? lq - kq * c + log_sphere_area(d)
                             : lq - log_normalizer_scaled(kappa_p, d) - kq * c + kappa_p * c;
  const double slope = kq >= 0.0 && !is_inf(kq) ? bessel::iv_ratio_grad(0.5 * d, kq) : NAN;
  return {groups * one, groups * kq * (uniform ? kq : kq - kappa_p) * slope};
}

}  // namespace rdp
}  // namespace vmfdist
