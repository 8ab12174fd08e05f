// CPU passes of the mean-field ops (math and noise layout: vmfdist/meanfield.h).  rho is cut
// into chunks of meanfield::kChunk elements, the parallel range; a chunk evaluates softplus(rho)
// (and the KL terms) once and then serves every sample, so no temporary of the output's size is
// made.  The normals of an element depend only on (seed, offset, sample, position) and the KL's
// chunk sums are added in a fixed order, so any thread count gives the same bits.  Every
// parallel_for task runs through isa::dispatch (isa_dispatch.h): the loops over a chunk are compiled
// for baseline x86-64 and for AVX2 + FMA, the copy chosen at run time.  The operators (checks,
// seed, outputs) are shared with CUDA: meanfield::Ops in host/meanfield_host.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/chunk_sum_cpu.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/meanfield.h"
#include "host/meanfield_host.h"
#include "host/random_state.h"

namespace vmfdist {
namespace {

using meanfield::kChunk;
using meanfield::Operands;

// f(c, start, n) for every chunk c of a D-element rho (its elements [start, start + n)), with
// `per_chunk` units of work per chunk: at least 4096 units per task (smaller ranges stay on the
// calling thread).  One parallel_for task at a time, through isa::dispatch.
template <class F>
void for_each_chunk(int64_t D, int64_t per_chunk, const F& f) {
  const int64_t nchunk = (D + kChunk - 1) / kChunk;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, per_chunk));
  at::parallel_for(0, nchunk, grain, [&](int64_t b, int64_t e) {
    isa::dispatch([&] {
      for (int64_t c = b; c < e; ++c) {
        const int64_t start = c * kChunk;
        f(c, start, std::min(kChunk, D - start));
      }
    });
  });
}

template <typename scalar_t>
const scalar_t* ptr_or_null(const at::Tensor& x) {
  return x.defined() ? x.const_data_ptr<scalar_t>() : nullptr;
}

// The data of a pass's operands: mu (null without loc), rho, the prior's loc and scale (null
// without a prior) and the prior's single-element form.
template <typename scalar_t, typename T>
struct Pointers {
  const scalar_t *mu, *rho, *m, *s;
  bool m_full, s_full;
  meanfield::Prior<T> p0;

  explicit Pointers(const Operands& x)
      : mu(ptr_or_null<scalar_t>(x.loc)),
        rho(x.rho.const_data_ptr<scalar_t>()),
        m(ptr_or_null<scalar_t>(x.prior_loc)),
        s(ptr_or_null<scalar_t>(x.prior_scale)),
        m_full(m != nullptr && x.prior_loc.numel() != 1),
        s_full(s != nullptr && x.prior_scale.numel() != 1),
        p0{} {
    if (m != nullptr) p0 = meanfield::prior_of<T>(static_cast<T>(m[0]), static_cast<T>(s[0]));
  }
};

// f.template operator()<kWithKl, kLocFull, kScaleFull>() for the prior of one entry (without
// a prior: kWithKl false and the layout flags unused).
template <class F>
void dispatch_prior(bool with_kl, bool loc_full, bool scale_full, const F& f) {
  if (!with_kl) {
    f.template operator()<false, false, false>();
  } else if (loc_full) {
    scale_full ? f.template operator()<true, true, true>() : f.template operator()<true, true, false>();
  } else {
    scale_full ? f.template operator()<true, false, true>() : f.template operator()<true, false, false>();
  }
}

// The prior of element i: p0 with the per-element loc and scale where the prior has them.
template <typename scalar_t, typename T, bool kLocFull, bool kScaleFull>
VMF_FORCEINLINE meanfield::Prior<T> prior_at(const meanfield::Prior<T>& p0, const scalar_t* m, const scalar_t* s,
                                             int64_t i) {
  meanfield::Prior<T> p = p0;
  if constexpr (kLocFull) p.m = static_cast<T>(m[i]);
  if constexpr (kScaleFull) p = meanfield::prior_of<T>(p.m, static_cast<T>(s[i]));
  return p;
}

// ---- sampling (with the KL in the same pass) ------------------------------------------

// eps[i] = normal start + i of stream (seed, offset, stream), i < n, in the op-math type.
template <typename scalar_t, typename T>
void noise_chunk(uint64_t seed, uint64_t offset, uint64_t stream, int64_t start, int64_t n, T* eps) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    fast_normal::normals_f32(seed, offset, stream, static_cast<uint32_t>(start / 4), n, eps);
  } else {
    double z[4];
    for (int64_t i = 0; i < n; i += 4) {
      fast_normal::normal4_f64(seed, offset, stream, static_cast<uint32_t>((start + i) / 4), z);
      for (int64_t k = 0; k < 4 && i + k < n; ++k) eps[i + k] = static_cast<T>(z[k]);
    }
  }
}

// sigma[i] = softplus(rho[i]), and kl[i] = the KL term of element i when kWithKl.
template <typename scalar_t, typename T, bool kWithKl, bool kLocFull, bool kScaleFull>
void scale_kl_chunk(const scalar_t* mu, const scalar_t* rho, const scalar_t* m, const scalar_t* s,
                    meanfield::Prior<T> p0, int64_t n, T* sigma, T* kl) {
  for (int64_t i = 0; i < n; ++i) {
    const T r = static_cast<T>(rho[i]);
    const meanfield::Scale<T> q = meanfield::scale_of<T>(r);
    sigma[i] = q.sigma;
    if constexpr (kWithKl) {
      const meanfield::Prior<T> p = prior_at<scalar_t, T, kLocFull, kScaleFull>(p0, m, s, i);
      kl[i] = meanfield::kl_term<T>(static_cast<T>(mu[i]), r, q, p);
    }
  }
}

template <typename scalar_t, typename T>
void combine_chunk(scalar_t* out, const scalar_t* loc, const T* sigma, const T* eps, int64_t n) {
  if (loc != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<scalar_t>(static_cast<T>(loc[i]) + sigma[i] * eps[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<scalar_t>(sigma[i] * eps[i]);
  }
}

// grad_rho = sigmoid(rho) acc_ge and grad_loc = acc_g (when kLocGrad), each plus the KL's
// derivative times g_kl when kWithKl.  (Flags as template arguments: a test inside the loop
// would keep it from vectorising.)
template <typename scalar_t, typename T, bool kLocGrad, bool kWithKl, bool kLocFull, bool kScaleFull>
void finish_grad_chunk(T g_kl, const scalar_t* mu, const scalar_t* rho, const scalar_t* m, const scalar_t* s,
                       meanfield::Prior<T> p0, const T* acc_ge, const T* acc_g, int64_t n, scalar_t* g_mu,
                       scalar_t* g_rho) {
  for (int64_t i = 0; i < n; ++i) {
    const T r = static_cast<T>(rho[i]);
    if constexpr (kWithKl) {
      const meanfield::Prior<T> p = prior_at<scalar_t, T, kLocFull, kScaleFull>(p0, m, s, i);
      const meanfield::Scale<T> q = meanfield::scale_of<T>(r);
      T a, b;
      meanfield::kl_grads<T>(g_kl, static_cast<T>(mu[i]), r, q, p, &a, &b);
      g_rho[i] = static_cast<scalar_t>(q.sigmoid * acc_ge[i] + b);
      if constexpr (kLocGrad) g_mu[i] = static_cast<scalar_t>(acc_g[i] + a);
    } else {
      g_rho[i] = static_cast<scalar_t>(meanfield::sigmoid<T>(r) * acc_ge[i]);
      if constexpr (kLocGrad) g_mu[i] = static_cast<scalar_t>(acc_g[i]);
    }
  }
}

// acc_ge (+)= g * eps and, with kLoc, acc_g (+)= g: the first sample (kFirst) assigns.
template <typename scalar_t, typename T, bool kFirst, bool kLoc>
void accumulate_chunk(T* acc_ge, T* acc_g, const scalar_t* g, const T* eps, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = static_cast<T>(g[i]);
    acc_ge[i] = kFirst ? gi * eps[i] : acc_ge[i] + gi * eps[i];
    if constexpr (kLoc) acc_g[i] = kFirst ? gi : acc_g[i] + gi;
  }
}

// ---- the KL alone --------------------------------------------------------------------

template <typename scalar_t, typename T, bool kLocFull, bool kScaleFull>
void kl_terms_chunk(const scalar_t* mu, const scalar_t* rho, const scalar_t* m, const scalar_t* s,
                    meanfield::Prior<T> p0, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    const meanfield::Prior<T> p = prior_at<scalar_t, T, kLocFull, kScaleFull>(p0, m, s, i);
    out[i] = meanfield::kl_term<T>(static_cast<T>(mu[i]), static_cast<T>(rho[i]), p);
  }
}

template <typename scalar_t, typename T, bool kLocFull, bool kScaleFull>
void kl_grads_chunk(T g, const scalar_t* mu, const scalar_t* rho, const scalar_t* m, const scalar_t* s,
                    meanfield::Prior<T> p0, int64_t n, scalar_t* g_mu, scalar_t* g_rho) {
  for (int64_t i = 0; i < n; ++i) {
    const meanfield::Prior<T> p = prior_at<scalar_t, T, kLocFull, kScaleFull>(p0, m, s, i);
    T a, b;
    meanfield::kl_grads<T>(g, static_cast<T>(mu[i]), static_cast<T>(rho[i]), p, &a, &b);
    g_mu[i] = static_cast<scalar_t>(a);
    g_rho[i] = static_cast<scalar_t>(b);
  }
}

struct CpuMeanfield : CpuSeeds {
  static void sample(at::Tensor& out, at::Tensor& noise, at::Tensor& kl, const Operands& x, const SeedOffset& so) {
    const int64_t S = out.size(0), D = x.rho.numel();
    const bool with_kl = x.with_kl(), save_noise = noise.numel() > 0;
    std::vector<double> partial(static_cast<size_t>(with_kl ? (D + kChunk - 1) / kChunk : 0), 0.0);
    const uint64_t sd = so.seed, of = so.offset;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_sample", [&] {
      using T = at::opmath_type<scalar_t>;
      const Pointers<scalar_t, T> en(x);
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      T* pn = save_noise ? noise.mutable_data_ptr<T>() : nullptr;
      for_each_chunk(D, std::max<int64_t>(S, 1) * kChunk, [&](int64_t c, int64_t start, int64_t n) {
        alignas(64) T sigma[kChunk], terms[kChunk], buf[kChunk];
        const scalar_t* mu = en.mu == nullptr ? nullptr : en.mu + start;
        dispatch_prior(with_kl, en.m_full, en.s_full, [&]<bool kWithKl, bool kLocFull, bool kScaleFull>() {
          scale_kl_chunk<scalar_t, T, kWithKl, kLocFull, kScaleFull>(
              mu, en.rho + start, kWithKl ? en.m + (kLocFull ? start : 0) : nullptr,
              kWithKl ? en.s + (kScaleFull ? start : 0) : nullptr, en.p0, n, sigma, terms);
        });
        if (with_kl) partial[static_cast<size_t>(c)] = sum_chunk<T>(terms, n);
        for (int64_t s = 0; s < S; ++s) {
          T* eps = pn != nullptr ? pn + s * D + start : buf;  // straight into `noise` when kept
          noise_chunk<scalar_t, T>(sd, of, static_cast<uint64_t>(s), start, n, eps);
          combine_chunk<scalar_t, T>(po + s * D + start, mu, sigma, eps, n);
        }
      });
    });
    if (with_kl) fill_total(kl, partial);
  }

  static void sample_backward(at::Tensor& g_loc, at::Tensor& g_rho, const at::Tensor& grad, const at::Tensor& noise,
                              const Operands& x, const at::Tensor& grad_kl, const SeedOffset& so) {
    const int64_t S = grad.size(0), D = x.rho.numel();
    const bool with_kl = x.with_kl(), loc_grad = g_loc.numel() > 0;
    const double gkl = with_kl ? grad_kl.item<double>() : 0.0;
    const uint64_t sd = so.seed, of = so.offset;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_sample_backward", [&] {
      using T = at::opmath_type<scalar_t>;
      const Pointers<scalar_t, T> en(x);
      const T g_kl = static_cast<T>(gkl);
      const scalar_t* pg = grad.const_data_ptr<scalar_t>();
      const T* pn = noise.defined() ? noise.const_data_ptr<T>() : nullptr;
      for_each_chunk(D, std::max<int64_t>(S, 1) * kChunk, [&](int64_t, int64_t start, int64_t n) {
        alignas(64) T acc_ge[kChunk], acc_g[kChunk], buf[kChunk];
        if (S == 0) {  // only the KL: no samples to differentiate
          std::fill(acc_ge, acc_ge + n, T(0));
          if (loc_grad) std::fill(acc_g, acc_g + n, T(0));
        }
        for (int64_t s = 0; s < S; ++s) {
          const T* eps = pn != nullptr ? pn + s * D + start : buf;
          if (pn == nullptr) noise_chunk<scalar_t, T>(sd, of, static_cast<uint64_t>(s), start, n, buf);
          const scalar_t* g = pg + s * D + start;
          if (s == 0) {
            loc_grad ? accumulate_chunk<scalar_t, T, true, true>(acc_ge, acc_g, g, eps, n)
                     : accumulate_chunk<scalar_t, T, true, false>(acc_ge, acc_g, g, eps, n);
          } else {
            loc_grad ? accumulate_chunk<scalar_t, T, false, true>(acc_ge, acc_g, g, eps, n)
                     : accumulate_chunk<scalar_t, T, false, false>(acc_ge, acc_g, g, eps, n);
          }
        }
        scalar_t* gm = loc_grad ? g_loc.mutable_data_ptr<scalar_t>() + start : nullptr;
        scalar_t* gr = g_rho.mutable_data_ptr<scalar_t>() + start;
        dispatch_prior(with_kl, en.m_full, en.s_full, [&]<bool kWithKl, bool kLocFull, bool kScaleFull>() {
          const scalar_t* mu = kWithKl ? en.mu + start : nullptr;
          const scalar_t* m = kWithKl ? en.m + (kLocFull ? start : 0) : nullptr;
          const scalar_t* sc = kWithKl ? en.s + (kScaleFull ? start : 0) : nullptr;
          if (loc_grad) {
            finish_grad_chunk<scalar_t, T, true, kWithKl, kLocFull, kScaleFull>(g_kl, mu, en.rho + start, m, sc,
                                                                                en.p0, acc_ge, acc_g, n, gm, gr);
          } else {
            finish_grad_chunk<scalar_t, T, false, kWithKl, kLocFull, kScaleFull>(g_kl, mu, en.rho + start, m, sc,
                                                                                 en.p0, acc_ge, acc_g, n, gm, gr);
          }
        });
      });
    });
  }

  static void kl(at::Tensor& kl, const Operands& x) {
    const int64_t D = x.rho.numel();
    std::vector<double> partial(static_cast<size_t>((D + kChunk - 1) / kChunk), 0.0);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_kl", [&] {
      using T = at::opmath_type<scalar_t>;
      const Pointers<scalar_t, T> en(x);
      for_each_chunk(D, kChunk, [&](int64_t c, int64_t start, int64_t n) {
        alignas(64) T terms[kChunk];
        dispatch_prior(true, en.m_full, en.s_full, [&]<bool, bool kLocFull, bool kScaleFull>() {
          kl_terms_chunk<scalar_t, T, kLocFull, kScaleFull>(en.mu + start, en.rho + start,
                                                            en.m + (kLocFull ? start : 0),
                                                            en.s + (kScaleFull ? start : 0), en.p0, n, terms);
        });
        partial[static_cast<size_t>(c)] = sum_chunk<T>(terms, n);
      });
    });
    fill_total(kl, partial);
  }

  static void kl_backward(at::Tensor& g_loc, at::Tensor& g_rho, const at::Tensor& grad, const Operands& x) {
    const double gv = grad.item<double>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_kl_backward", [&] {
      using T = at::opmath_type<scalar_t>;
      const Pointers<scalar_t, T> en(x);
      const T g = static_cast<T>(gv);
      scalar_t* pgm = g_loc.mutable_data_ptr<scalar_t>();
      scalar_t* pgr = g_rho.mutable_data_ptr<scalar_t>();
      for_each_chunk(x.rho.numel(), kChunk, [&](int64_t, int64_t start, int64_t n) {
        dispatch_prior(true, en.m_full, en.s_full, [&]<bool, bool kLocFull, bool kScaleFull>() {
          kl_grads_chunk<scalar_t, T, kLocFull, kScaleFull>(g, en.mu + start, en.rho + start,
                                                            en.m + (kLocFull ? start : 0),
                                                            en.s + (kScaleFull ? start : 0), en.p0, n, pgm + start,
                                                            pgr + start);
        });
      });
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("meanfield_sample", &meanfield::Ops<CpuMeanfield>::sample);
  m.impl("meanfield_sample_backward", &meanfield::Ops<CpuMeanfield>::sample_backward);
  m.impl("meanfield_kl", &meanfield::Ops<CpuMeanfield>::kl);
  m.impl("meanfield_kl_backward", &meanfield::Ops<CpuMeanfield>::kl_backward);
}

}  // namespace vmfdist
