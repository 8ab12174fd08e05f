// CPU kernels of the mean-field ops (math and noise layout: vmfdist/meanfield.h; argument
// checks: host/meanfield_checks.h).  rho is cut into chunks of meanfield::kChunk elements, the
// parallel range; a chunk evaluates softplus(rho) (and the KL terms) once and then serves
// every sample, so no temporary of the output's size is made.  The normals of an element
// depend only on (seed, offset, sample, position) and the KL's chunk sums are added in a
// fixed order, so any thread count gives the same bits.  Every parallel_for task runs through
// isa::dispatch (macros.h): the loops over a chunk are compiled for baseline x86-64 and for
// AVX2 + FMA, the copy chosen at run time.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "vmfdist/meanfield.h"
#include "host/meanfield_checks.h"
#include "host/random_state.h"

namespace vmfdist {
namespace {

using meanfield::kChunk;

// Chunks per task for `per_chunk` units of work per chunk: at least 4096 elements' worth
// (smaller ranges stay on the calling thread).
inline int64_t grain_for(int64_t per_chunk) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(1, per_chunk)); }

template <typename scalar_t>
const scalar_t* ptr_or_null(const at::Tensor& x) {
  return x.defined() ? x.const_data_ptr<scalar_t>() : nullptr;
}

inline at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return given(t) ? t->contiguous() : at::Tensor();
}

// The operands of a kernel: mu (null without loc), rho, the prior's loc and scale (null
// without a prior) and the prior's single-element form.
template <typename scalar_t, typename T>
struct Operands {
  const scalar_t *mu, *rho, *m, *s;
  bool m_full, s_full;
  meanfield::Prior<T> p0;
};

template <typename scalar_t, typename T>
Operands<scalar_t, T> operands(const at::Tensor& loc, const at::Tensor& rho, const at::Tensor& pm,
                               const at::Tensor& ps) {
  Operands<scalar_t, T> e{ptr_or_null<scalar_t>(loc), rho.const_data_ptr<scalar_t>(), ptr_or_null<scalar_t>(pm),
                          ptr_or_null<scalar_t>(ps), false, false, {}};
  if (e.m != nullptr) {
    e.m_full = pm.numel() != 1;
    e.s_full = ps.numel() != 1;
    if (rho.numel() > 0) e.p0 = meanfield::prior_of<T>(static_cast<T>(e.m[0]), static_cast<T>(e.s[0]));
  }
  return e;
}

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

// Sum in double with 8 independent partial sums (fixed order).
template <typename T>
double sum_chunk(const T* x, int64_t n) {
  double a[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) a[l] += static_cast<double>(x[i + l]);
  }
  for (int l = 0; i + l < n; ++l) a[l] += static_cast<double>(x[i + l]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> meanfield_sample_cpu(
    const std::optional<at::Tensor>& loc_in, const at::Tensor& rho_in, const std::optional<at::Tensor>& prior_loc_in,
    const std::optional<at::Tensor>& prior_scale_in, c10::SymInt num_samples_in, bool save_noise,
    std::optional<at::Generator> generator, std::optional<int64_t> seed_in, std::optional<int64_t> offset_in) {
  const int64_t S = num_samples_in.expect_int();
  const bool with_kl = check_meanfield_sample_args(loc_in, rho_in, prior_loc_in, prior_scale_in, S);
  const SeedOffset so = cpu_seed_offset("meanfield_sample", generator, seed_in, offset_in, 1);
  at::Tensor seed_offset = cpu_seed_offset_tensor(so);
  const at::Tensor rho = rho_in.contiguous(), loc = contiguous_or_undefined(loc_in);
  const at::Tensor pm = contiguous_or_undefined(prior_loc_in), ps = contiguous_or_undefined(prior_scale_in);
  auto [out, noise] = allocate_meanfield_outputs(rho, S, save_noise);
  at::Tensor kl = at::zeros({}, rho.options());
  const int64_t D = rho.numel();
  const int64_t nchunk = (D + kChunk - 1) / kChunk;
  if ((S == 0 && !with_kl) || D == 0) return {out, noise, kl, seed_offset};
  std::vector<double> partial(static_cast<size_t>(with_kl ? nchunk : 0), 0.0);
  const uint64_t sd = so.seed, of = so.offset;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rho.scalar_type(), "meanfield_sample", [&] {
    using T = at::opmath_type<scalar_t>;
    const auto en = operands<scalar_t, T>(loc, rho, pm, ps);
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    T* pn = save_noise ? noise.mutable_data_ptr<T>() : nullptr;
    at::parallel_for(0, nchunk, grain_for(std::max<int64_t>(S, 1) * kChunk), [&](int64_t b, int64_t e) {
      std::vector<T> sigma(static_cast<size_t>(kChunk)), terms(static_cast<size_t>(with_kl ? kChunk : 0));
      std::vector<T> buf(static_cast<size_t>(save_noise ? 0 : kChunk));
      isa::dispatch([&] {
        for (int64_t c = b; c < e; ++c) {
          const int64_t start = c * kChunk;
          const int64_t n = std::min(kChunk, D - start);
          const scalar_t* mu = en.mu == nullptr ? nullptr : en.mu + start;
          dispatch_prior(with_kl, en.m_full, en.s_full, [&]<bool kWithKl, bool kLocFull, bool kScaleFull>() {
            scale_kl_chunk<scalar_t, T, kWithKl, kLocFull, kScaleFull>(
                mu, en.rho + start, kWithKl ? en.m + (kLocFull ? start : 0) : nullptr,
                kWithKl ? en.s + (kScaleFull ? start : 0) : nullptr, en.p0, n, sigma.data(), terms.data());
          });
          if (with_kl) partial[static_cast<size_t>(c)] = sum_chunk<T>(terms.data(), n);
          for (int64_t s = 0; s < S; ++s) {
            T* eps = pn != nullptr ? pn + s * D + start : buf.data();  // straight into `noise` when kept
            noise_chunk<scalar_t, T>(sd, of, static_cast<uint64_t>(s), start, n, eps);
            combine_chunk<scalar_t, T>(po + s * D + start, mu, sigma.data(), eps, n);
          }
        }
      });
    });
    if (with_kl) {
      double total = 0.0;
      for (const double v : partial) total += v;
      kl.fill_(total);
    }
  });
  return {out, noise, kl, seed_offset};
}

std::tuple<at::Tensor, at::Tensor> meanfield_sample_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& rho_in, const at::Tensor& seed_offset,
    const std::optional<at::Tensor>& noise_in, const std::optional<at::Tensor>& loc_in,
    const std::optional<at::Tensor>& prior_loc_in, const std::optional<at::Tensor>& prior_scale_in,
    const std::optional<at::Tensor>& grad_kl, bool loc_grad) {
  constexpr const char* op = "meanfield_sample_backward";
  const bool with_kl = check_meanfield_backward_args(op, grad_in, rho_in, noise_in, loc_in, prior_loc_in,
                                                     prior_scale_in, grad_kl, loc_grad);
  const SeedOffset so = read_seed_offset_cpu(op, seed_offset, 1);
  const at::Tensor grad = grad_in.contiguous(), rho = rho_in.contiguous();
  const at::Tensor noise = contiguous_or_undefined(noise_in), loc = contiguous_or_undefined(loc_in);
  const at::Tensor pm = contiguous_or_undefined(prior_loc_in), ps = contiguous_or_undefined(prior_scale_in);
  at::Tensor g_rho = at::empty_like(rho, at::MemoryFormat::Contiguous);
  at::Tensor g_loc = loc_grad ? at::empty_like(rho, at::MemoryFormat::Contiguous) : at::empty({0}, rho.options());
  const int64_t S = grad.size(0), D = rho.numel();
  if (D == 0) return {g_loc, g_rho};
  const int64_t nchunk = (D + kChunk - 1) / kChunk;
  const double gkl = with_kl ? grad_kl->item<double>() : 0.0;
  const uint64_t sd = so.seed, of = so.offset;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rho.scalar_type(), op, [&] {
    using T = at::opmath_type<scalar_t>;
    const auto en = operands<scalar_t, T>(with_kl ? loc : at::Tensor(), rho, pm, ps);
    const T g_kl = static_cast<T>(gkl);
    const scalar_t* pg = grad.const_data_ptr<scalar_t>();
    const T* pn = noise.defined() ? noise.const_data_ptr<T>() : nullptr;
    at::parallel_for(0, nchunk, grain_for(std::max<int64_t>(S, 1) * kChunk), [&](int64_t b, int64_t e) {
      std::vector<T> acc_ge(static_cast<size_t>(kChunk)), acc_g(static_cast<size_t>(loc_grad ? kChunk : 0));
      std::vector<T> buf(static_cast<size_t>(pn != nullptr ? 0 : kChunk));
      isa::dispatch([&] {
        for (int64_t c = b; c < e; ++c) {
          const int64_t start = c * kChunk;
          const int64_t n = std::min(kChunk, D - start);
          if (S == 0) {  // only the KL: no samples to differentiate
            std::fill(acc_ge.begin(), acc_ge.begin() + n, T(0));
            if (loc_grad) std::fill(acc_g.begin(), acc_g.begin() + n, T(0));
          }
          for (int64_t s = 0; s < S; ++s) {
            const T* eps = pn != nullptr ? pn + s * D + start : buf.data();
            if (pn == nullptr) noise_chunk<scalar_t, T>(sd, of, static_cast<uint64_t>(s), start, n, buf.data());
            const scalar_t* g = pg + s * D + start;
            if (s == 0) {
              loc_grad ? accumulate_chunk<scalar_t, T, true, true>(acc_ge.data(), acc_g.data(), g, eps, n)
                       : accumulate_chunk<scalar_t, T, true, false>(acc_ge.data(), acc_g.data(), g, eps, n);
            } else {
              loc_grad ? accumulate_chunk<scalar_t, T, false, true>(acc_ge.data(), acc_g.data(), g, eps, n)
                       : accumulate_chunk<scalar_t, T, false, false>(acc_ge.data(), acc_g.data(), g, eps, n);
            }
          }
          scalar_t* gm = loc_grad ? g_loc.mutable_data_ptr<scalar_t>() + start : nullptr;
          scalar_t* gr = g_rho.mutable_data_ptr<scalar_t>() + start;
          dispatch_prior(with_kl, en.m_full, en.s_full, [&]<bool kWithKl, bool kLocFull, bool kScaleFull>() {
            const scalar_t* mu = kWithKl ? en.mu + start : nullptr;
            const scalar_t* m = kWithKl ? en.m + (kLocFull ? start : 0) : nullptr;
            const scalar_t* sc = kWithKl ? en.s + (kScaleFull ? start : 0) : nullptr;
            if (loc_grad) {
              finish_grad_chunk<scalar_t, T, true, kWithKl, kLocFull, kScaleFull>(
                  g_kl, mu, en.rho + start, m, sc, en.p0, acc_ge.data(), acc_g.data(), n, gm, gr);
            } else {
              finish_grad_chunk<scalar_t, T, false, kWithKl, kLocFull, kScaleFull>(
                  g_kl, mu, en.rho + start, m, sc, en.p0, acc_ge.data(), acc_g.data(), n, gm, gr);
            }
          });
        }
      });
    });
  });
  return {g_loc, g_rho};
}

// ---- KL alone -------------------------------------------------------------------------

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

at::Tensor meanfield_kl_cpu(const at::Tensor& loc_in, const at::Tensor& rho_in, const at::Tensor& prior_loc_in,
                            const at::Tensor& prior_scale_in) {
  constexpr const char* op = "meanfield_kl";
  check_meanfield_kl_args(op, loc_in, rho_in, prior_loc_in, prior_scale_in);
  const at::Tensor loc = loc_in.contiguous(), rho = rho_in.contiguous();
  const at::Tensor pm = prior_loc_in.contiguous(), ps = prior_scale_in.contiguous();
  const int64_t D = rho.numel();
  const int64_t nchunk = (D + kChunk - 1) / kChunk;
  at::Tensor out = at::zeros({}, rho.options());
  if (D == 0) return out;
  std::vector<double> partial(static_cast<size_t>(nchunk), 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rho.scalar_type(), op, [&] {
    using T = at::opmath_type<scalar_t>;
    const auto en = operands<scalar_t, T>(loc, rho, pm, ps);
    at::parallel_for(0, nchunk, grain_for(kChunk), [&](int64_t b, int64_t e) {
      std::vector<T> terms(static_cast<size_t>(kChunk));
      isa::dispatch([&] {
        for (int64_t c = b; c < e; ++c) {
          const int64_t start = c * kChunk;
          const int64_t n = std::min(kChunk, D - start);
          dispatch_prior(true, en.m_full, en.s_full, [&]<bool kWithKl, bool kLocFull, bool kScaleFull>() {
            kl_terms_chunk<scalar_t, T, kLocFull, kScaleFull>(en.mu + start, en.rho + start,
                                                              en.m + (kLocFull ? start : 0),
                                                              en.s + (kScaleFull ? start : 0), en.p0, n, terms.data());
          });
          partial[static_cast<size_t>(c)] = sum_chunk<T>(terms.data(), n);
        }
      });
    });
    double total = 0.0;
    for (const double v : partial) total += v;
    out.fill_(total);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> meanfield_kl_backward_cpu(const at::Tensor& grad, const at::Tensor& loc_in,
                                                             const at::Tensor& rho_in, const at::Tensor& prior_loc_in,
                                                             const at::Tensor& prior_scale_in) {
  constexpr const char* op = "meanfield_kl_backward";
  check_meanfield_kl_args(op, loc_in, rho_in, prior_loc_in, prior_scale_in);
  check_grad_kl(op, grad, rho_in);
  const at::Tensor loc = loc_in.contiguous(), rho = rho_in.contiguous();
  const at::Tensor pm = prior_loc_in.contiguous(), ps = prior_scale_in.contiguous();
  at::Tensor g_mu = at::empty_like(rho, at::MemoryFormat::Contiguous);
  at::Tensor g_rho = at::empty_like(rho, at::MemoryFormat::Contiguous);
  const int64_t D = rho.numel();
  if (D == 0) return {g_mu, g_rho};
  const int64_t nchunk = (D + kChunk - 1) / kChunk;
  const double gv = grad.item<double>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rho.scalar_type(), op, [&] {
    using T = at::opmath_type<scalar_t>;
    const auto en = operands<scalar_t, T>(loc, rho, pm, ps);
    const T g = static_cast<T>(gv);
    scalar_t* pgm = g_mu.mutable_data_ptr<scalar_t>();
    scalar_t* pgr = g_rho.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, nchunk, grain_for(kChunk), [&](int64_t b, int64_t e) {
      isa::dispatch([&] {
        for (int64_t c = b; c < e; ++c) {
          const int64_t start = c * kChunk;
          const int64_t n = std::min(kChunk, D - start);
          dispatch_prior(true, en.m_full, en.s_full, [&]<bool kWithKl, bool kLocFull, bool kScaleFull>() {
            kl_grads_chunk<scalar_t, T, kLocFull, kScaleFull>(g, en.mu + start, en.rho + start,
                                                              en.m + (kLocFull ? start : 0),
                                                              en.s + (kScaleFull ? start : 0), en.p0, n, pgm + start,
                                                              pgr + start);
          });
        }
      });
    });
  });
  return {g_mu, g_rho};
}

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("meanfield_sample", &meanfield_sample_cpu);
  m.impl("meanfield_sample_backward", &meanfield_sample_backward_cpu);
  m.impl("meanfield_kl", &meanfield_kl_cpu);
  m.impl("meanfield_kl_backward", &meanfield_kl_backward_cpu);
}

}  // namespace vmfdist
