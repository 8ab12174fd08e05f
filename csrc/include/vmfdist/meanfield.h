// Mean-field Gaussian weights with a softplus scale -- the posterior of the Bayesian
// layers vmfdist.nn.MeanFieldLinear / MeanFieldConv2d -- written once for the CPU loops
// (csrc/cpu/meanfield_cpu.cpp) and the CUDA kernels (csrc/cuda/meanfield_cuda.cu):
//
//   sigma = softplus(rho) = log(1 + e^rho)
//   meanfield_sample:           out[s] = loc + sigma * eps_s,    eps_s ~ N(0, I)
//                               (and, optionally, the KL below in the same pass)
//   meanfield_sample_backward:  d/dloc = sum_s grad[s],  d/drho = sigmoid(rho) sum_s grad[s] eps_s
//                               (eps kept by the forward pass or regenerated), plus the KL's
//   meanfield_kl:               sum_i log(s_i / sigma_i) + (sigma_i^2 + (mu_i - m_i)^2) / (2 s_i^2) - 1/2
//                               (KL to the prior N(m, s^2), elementwise, summed)
//   meanfield_kl_backward:      d/dmu = (mu - m) / s^2,  d/drho = sigmoid(rho) (sigma / s^2 - 1 / sigma)
//
// Noise layout (part of the reproducibility contract): element j (row-major index in
// rho's shape) of sample s of the op's tensor-list entry k is normal j of the Philox
// stream (seed, offset, k * num_samples + s) -- block j / 4, lane j % 4 of
// fast_normal::normal4_f32 for float32 (the float Box-Muller), of fast_normal::normal4_f64
// for the other dtypes; for one entry these are radial_noise's eps for a whole-tensor
// event (radial.h).  So the samples do not depend on the thread count or the device, and
// a backward pass can regenerate eps instead of reading it back.
//
// Arithmetic is in the "op math" type: float for float32 (and half / bfloat16), double
// for float64.  In float the exponential and log1p are the branch-free polynomials below
// (own derivations, like fast_normal.h's Box-Muller) so that the CPU loops vectorise and
// host and device compute the same bits; in double they are libm's.  The KL sum is
// accumulated in double in fixed-size chunks added in order (thread-count independent).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vmfdist/fast_normal.h"
#include "vmfdist/macros.h"

namespace vmfdist {
namespace meanfield {

// Elements per unit of work (a multiple of 4 * fast_normal::kLanes, so that every chunk
// starts on a Philox block boundary and the vectorised normals cover it); small enough that a
// convolution kernel of some 10^4 weights still splits over the threads.  The KL is summed per
// chunk, so the chunk size (not the thread count) fixes the summation order.
constexpr int64_t kChunk = 1024;

// ---- float: exp on (-inf, 0], log1p on [0, 1] ----------------------------------------
// Branch-free: every selection below is made on integer bits (GCC does not if-convert a
// float comparison in a loop that also converts floats to integers, under the default
// -ftrapping-math, and the loop would not vectorise).

VMF_FORCEINLINE bool sign_set(float x) { return (fast_normal::float_bits(x) >> 31) != 0u; }
VMF_FORCEINLINE bool is_nan_f(float x) { return (fast_normal::float_bits(x) & 0x7fffffffu) > 0x7f800000u; }
// x < c for a constant c < 0 (false for NaN).
VMF_FORCEINLINE bool below_neg(float x, float c) {
  const uint32_t b = fast_normal::float_bits(x);
  return (b >> 31) != 0u && (b & 0x7fffffffu) > (fast_normal::float_bits(c) & 0x7fffffffu) &&
         (b & 0x7fffffffu) <= 0x7f800000u;
}
VMF_FORCEINLINE float select_f(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return fast_normal::bits_float((fast_normal::float_bits(a) & m) | (fast_normal::float_bits(b) & ~m));
}

// e^x for x <= 0 (0 below -104, where e^x is under half the smallest subnormal float;
// the sign of x is ignored, so x = -|x| may be passed as any float).
// x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2 (Cody--Waite: ln2 split so that
// n * kLn2Hi is exact for |n| < 2^8), e^r by its Taylor polynomial to r^7 (remainder
// below |r|^8 / 8! < 6e-9 relative), then times 2^n as 2^(n/2) 2^(n - n/2): both
// factors are normal floats, and the last product rounds once into the subnormal range.
VMF_FORCEINLINE float exp_nonpos(float x) {
  uint32_t b = fast_normal::float_bits(x) | 0x80000000u;  // -|x|
  b = b < 0xc2d00000u ? b : 0xc2d00000u;                   // max(-|x|, -104): -inf and NaN give -104
  x = fast_normal::bits_float(b);
  const float kLog2e = 1.44269504f;
  const float kShift = 12582912.0f;  // 1.5 * 2^23: (v + kShift) - kShift rounds v to an integer
  const float nf = (x * kLog2e + kShift) - kShift;
  const float kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
  const float r = (x - nf * kLn2Hi) - nf * kLn2Lo;
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (4.16666679e-2f + r * (8.33333377e-3f +
                                                                                     r * (1.38888892e-3f +
                                                                                          r * 1.98412701e-4f))))));
  const int32_t n = static_cast<int32_t>(nf);
  const int32_t n1 = n / 2, n2 = n - n1;  // both in [-76, 0]
  const float f1 = fast_normal::bits_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float f2 = fast_normal::bits_float(static_cast<uint32_t>(n2 + 127) << 23);
  return (p * f1) * f2;
}

// log(1 + t) for t in [0, 1]: with u = 1 + t rounded and d = u - 1 (exact),
// log(u) * t / d corrects the rounding of u to first order (the classical trick, a
// few ulp); t itself when u rounds to 1.  log_unit (fast_normal.h) is the float log
// of any positive normal float.
VMF_FORCEINLINE float log1p_unit(float t) {
  const float u = 1.0f + t;
  const float d = u - 1.0f;
  const bool tiny = fast_normal::float_bits(d) == 0u;
  const float l = fast_normal::log_unit(u) * (t / select_f(tiny, 1.0f, d));
  return select_f(tiny, t, l);
}

// ---- the softplus parameterisation, in the op-math type T (float or double) ----------

// Below this rho, sigma = log1p(t) with t = e^rho is t (1 - t/2 + ...): the closed
// forms log sigma = rho - t/2 and sigmoid(rho) / sigma = 1 - t/2 are exact to the
// type's precision there (the next terms are O(t^2)), and stay finite when sigma
// underflows.
template <typename T>
struct Small;
template <>
struct Small<float> {
  static constexpr float kRho = -16.0f;
};
template <>
struct Small<double> {
  static constexpr double kRho = -40.0;
};

// The quantities of one rho: t = e^{-|rho|}, sigma = softplus(rho), sigmoid(rho).
template <typename T>
struct Scale {
  T t, sigma, sigmoid;
};

// rho NaN gives NaN everywhere; rho = -inf gives sigma = 0, rho = +inf sigma = +inf.
template <typename T>
VMF_FORCEINLINE Scale<T> scale_of(T rho) {
  if constexpr (std::is_same_v<T, float>) {
    const bool neg = sign_set(rho);
    const float t = exp_nonpos(rho);
    const float pos = select_f(neg, 0.0f, rho);  // max(rho, 0)
    const float inv = 1.0f / (1.0f + t);
    const bool nan = is_nan_f(rho);
    return {t, select_f(nan, rho, pos + log1p_unit(t)), select_f(nan, rho, select_f(neg, t * inv, inv))};
  } else {
    const T t = ::exp(rho < T(0) ? rho : -rho);
    const T inv = T(1) / (T(1) + t);
    return {t, (rho > T(0) ? rho : T(0)) + ::log1p(t), rho >= T(0) ? inv : t * inv};
  }
}

template <typename T>
VMF_FORCEINLINE T softplus(T rho) {
  return scale_of<T>(rho).sigma;
}

// sigmoid(rho) = d sigma / d rho, without the logarithm.
template <typename T>
VMF_FORCEINLINE T sigmoid(T rho) {
  if constexpr (std::is_same_v<T, float>) {
    const float t = exp_nonpos(rho);
    const float inv = 1.0f / (1.0f + t);
    return select_f(is_nan_f(rho), rho, select_f(sign_set(rho), t * inv, inv));
  } else {
    const T t = ::exp(rho < T(0) ? rho : -rho);
    const T inv = T(1) / (T(1) + t);
    return rho >= T(0) ? inv : t * inv;
  }
}

// log of a positive normal number.
template <typename T>
VMF_FORCEINLINE T log_pos(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return fast_normal::log_unit(x);
  } else {
    return ::log(x);
  }
}

template <typename T>
VMF_FORCEINLINE bool small_rho(T rho) {
  if constexpr (std::is_same_v<T, float>) {
    return below_neg(rho, Small<float>::kRho);
  } else {
    return rho < Small<T>::kRho;
  }
}

template <typename T>
VMF_FORCEINLINE T select(bool c, T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    return select_f(c, a, b);
  } else {
    return c ? a : b;
  }
}

// log sigma (finite for every finite rho).
template <typename T>
VMF_FORCEINLINE T log_sigma(T rho, const Scale<T>& q) {
  const bool small = small_rho<T>(rho);
  const T direct = log_pos<T>(select<T>(small, T(1), q.sigma));
  return select<T>(small, rho - T(0.5) * q.t, direct);
}

// sigmoid(rho) / sigma, the derivative of log sigma (finite for every finite rho).
template <typename T>
VMF_FORCEINLINE T sigmoid_over_sigma(T rho, const Scale<T>& q) {
  const bool small = small_rho<T>(rho);
  const T direct = q.sigmoid / select<T>(small, T(1), q.sigma);
  return select<T>(small, T(1) - T(0.5) * q.t, direct);
}

// The prior N(m, s^2) of one element, in the form the formulas use.
template <typename T>
struct Prior {
  T m, inv_s, log_s;
};

template <typename T>
VMF_FORCEINLINE Prior<T> prior_of(T m, T s) {
  return {m, T(1) / s, log_pos<T>(s)};
}

// One element of the KL: log(s / sigma) + ((sigma / s)^2 + ((mu - m) / s)^2 - 1) / 2, with the
// scale quantities q = scale_of(rho) already at hand.
template <typename T>
VMF_FORCEINLINE T kl_term(T mu, T rho, const Scale<T>& q, const Prior<T>& p) {
  const T zs = q.sigma * p.inv_s;
  const T zm = (mu - p.m) * p.inv_s;
  return (p.log_s - log_sigma<T>(rho, q)) + T(0.5) * ((zs * zs + zm * zm) - T(1));
}

template <typename T>
VMF_FORCEINLINE T kl_term(T mu, T rho, const Prior<T>& p) {
  return kl_term<T>(mu, rho, scale_of<T>(rho), p);
}

// g times the two partial derivatives of kl_term: d/dmu = (mu - m) / s^2 and
// d/drho = sigmoid(rho) (sigma / s^2 - 1 / sigma).
template <typename T>
VMF_FORCEINLINE void kl_grads(T g, T mu, T rho, const Scale<T>& q, const Prior<T>& p, T* g_mu, T* g_rho) {
  const T inv_s2 = p.inv_s * p.inv_s;
  *g_mu = g * ((mu - p.m) * inv_s2);
  *g_rho = g * ((q.sigmoid * q.sigma) * inv_s2 - sigmoid_over_sigma<T>(rho, q));
}

template <typename T>
VMF_FORCEINLINE void kl_grads(T g, T mu, T rho, const Prior<T>& p, T* g_mu, T* g_rho) {
  kl_grads<T>(g, mu, rho, scale_of<T>(rho), p, g_mu, g_rho);
}

}  // namespace meanfield
}  // namespace vmfdist
