// Fused radial noise (Radial BNN posterior, Farquhar et al.): for each sample s,
//   out[s] = loc + scale * eps_s * (r_s / |eps_s|),   eps_s ~ N(0, I_D),  r_s ~ N(0, 1),
// with |eps_s| over the whole event (or over each row of the last dimension when
// `rowwise`; then every row has its own radius).  Shared by the CPU loops
// (csrc/cpu/radial_cpu.cpp) and the CUDA kernels (csrc/cuda/radial_cuda.cu).
//
// Randomness (part of the reproducibility contract): the event is split into G
// groups of length L (G = 1, L = D; or G = rows, L = row length).  Group g of
// sample s is "stream index" t = s G + g:
//   * its normals are those of the Philox stream (seed, offset, t), element k of the
//     group being normal k of that stream (block k / 4; fast_normal.h: float32
//     outputs use the float Box-Muller, other dtypes the double one);
//   * its radius is the first double Box-Muller normal of stream (seed, offset + 1, t).
// The sum of squares of a group is accumulated per chunk of kRadialChunk elements
// and the chunk sums are added in order, so the result does not depend on the
// thread count.  The backward pass regenerates eps from the same streams, or reads them
// from `noise` when the forward pass kept them (save_noise: same values, same bits).
//
// radial_sample is the Radial layers' training pass: the same eps and coef as radial_noise
// (whole-tensor event), with the scale softplus(rho) computed inside (meanfield.h's softplus,
// in the op-math type) and, given a prior N(m, s^2), the KL of Radial(loc, softplus(rho)) to
// it in the same pass.  With D = the event's size and sigma = softplus(rho),
//   KL = sum_i [log(s_i sqrt(D) / sigma_i) + sigma_i^2 / (2 D s_i^2) + (mu_i - m_i)^2 / (2 s_i^2) - 1/2] + K(D),
// K(D) = D (log(2 pi) / 2 - log(D) / 2 + 1/2) - C(D), C(D) the constant of the Radial entropy
// (added by the caller).  Each term is meanfield::kl_term with the prior N(m, D s^2) ("wide")
// plus (1 - 1/D) (mu - m)^2 / (2 s^2): kl_term and kl_grads below.
#pragma once

#include <cstdint>

#include "vmfdist/fast_normal.h"
#include "vmfdist/macros.h"
#include "vmfdist/meanfield.h"

namespace vmfdist {
namespace radial {

constexpr int64_t kRadialChunk = 4096;  // a multiple of 4: chunks start on Philox block boundaries

// r_t / sqrt(sum of squares): the factor every eps of group t is multiplied by.
VMF_INLINE double group_coef(uint64_t seed, uint64_t offset, uint64_t t, double sumsq) {
  double z[4];
  fast_normal::normal4_f64(seed, offset + 1, t, 0, z);
  return z[0] / ::sqrt(sumsq);
}

// The prior N(m, s^2) of one element in the form of the Radial KL: `wide` is N(m, D s^2) as
// meanfield::Prior, `extra` = (1 - 1/D) / s^2.
template <typename T>
struct KlPrior {
  meanfield::Prior<T> wide;
  T extra;
};

template <typename T>
VMF_FORCEINLINE KlPrior<T> kl_prior_of(T m, T s, T sqrt_d, T one_minus_inv_d) {
  const T inv_s = T(1) / s;
  return {meanfield::prior_of<T>(m, s * sqrt_d), one_minus_inv_d * (inv_s * inv_s)};
}

// One element's term of the Radial KL (without K(D)), q = meanfield::scale_of(rho).
template <typename T>
VMF_FORCEINLINE T kl_term(T mu, T rho, const meanfield::Scale<T>& q, const KlPrior<T>& p) {
  const T dm = mu - p.wide.m;
  return meanfield::kl_term<T>(mu, rho, q, p.wide) + T(0.5) * (p.extra * (dm * dm));
}

// g times the term's derivatives: d/dmu = (mu - m) / s^2, d/drho = sigmoid(rho) (sigma / (D s^2) - 1 / sigma).
template <typename T>
VMF_FORCEINLINE void kl_grads(T g, T mu, T rho, const meanfield::Scale<T>& q, const KlPrior<T>& p, T* g_mu,
                              T* g_rho) {
  meanfield::kl_grads<T>(g, mu, rho, q, p.wide, g_mu, g_rho);
  *g_mu += g * (p.extra * (mu - p.wide.m));
}

}  // namespace radial
}  // namespace vmfdist
