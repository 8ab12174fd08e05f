// CPU kernels of the fused radial noise and of radial_sample, its form with softplus(rho) and
// the KL inside (math and stream layout: vmfdist/radial.h).
// No temporaries of the output's size: pass 1 writes the normals into the output
// and sums their squares per chunk; pass 2 turns them into loc + scale eps coef in
// place (pass 1 also copies the normals into `noise` when the caller keeps them).  The backward
// pass reads the kept eps or regenerates them chunk by chunk.  The operators (checks,
// seed, outputs) are shared with CUDA: radial::Ops in host/radial_host.h.  Every
// parallel_for task runs through isa::dispatch (isa_dispatch.h): the normals and the loops
// over a chunk are compiled for baseline x86-64 and for AVX2 + FMA, the copy chosen at
// run time.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "cpu/chunk_sum_cpu.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/radial.h"
#include "host/radial_host.h"
#include "host/random_state.h"

namespace vmfdist {
namespace {

using radial::kRadialChunk;
using radial::RadialLayout;

template <class scalar_t>
double sum_squares(const scalar_t* x, int64_t n) {
  double a[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double v = static_cast<double>(x[i + l]);
      a[l] += v * v;
    }
  }
  for (int l = 0; i + l < n; ++l) {
    const double v = static_cast<double>(x[i + l]);
    a[l] += v * v;
  }
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// f(u, t, start, n) for every chunk u in [0, units): the elements [start, start + n) of
// stream (or group) t = u / nchunk, each of whose `length` elements is cut in nchunk chunks.
// One parallel_for task at a time, through isa::dispatch.
template <class F>
void for_each_chunk(int64_t units, int64_t nchunk, int64_t length, int64_t grain, const F& f) {
  at::parallel_for(0, units, grain, [&](int64_t b, int64_t e) {
    isa::dispatch([&] {
      for (int64_t u = b; u < e; ++u) {
        const int64_t t = u / nchunk, start = (u % nchunk) * kRadialChunk;
        f(u, t, start, std::min(kRadialChunk, length - start));
      }
    });
  });
}


// The prior of element i: the scalar one, or from the per-element loc and scale (kFull; each a
// chunk-sized buffer, the single-element one repeated).
template <typename T, bool kFull>
VMF_FORCEINLINE radial::KlPrior<T> kl_prior_at(const radial::KlPrior<T>& p0, const T* m, const T* s, int64_t i,
                                               T sqrt_d, T c1) {
  if constexpr (kFull) {
    return radial::kl_prior_of<T>(m[i], s[i], sqrt_d, c1);
  } else {
    return p0;
  }
}

// sigma[i] = softplus(rho[i]) and, with kWithKl, terms[i] = the Radial KL term of element i.
template <typename scalar_t, typename T, bool kWithKl, bool kFull>
void scale_kl_chunk(const scalar_t* mu, const scalar_t* rho, const radial::KlPrior<T>& p0, const T* m, const T* s,
                    T sqrt_d, T c1, int64_t n, T* sigma, T* terms) {
  for (int64_t i = 0; i < n; ++i) {
    const T r = static_cast<T>(rho[i]);
    const meanfield::Scale<T> q = meanfield::scale_of<T>(r);
    sigma[i] = q.sigma;
    if constexpr (kWithKl) {
      terms[i] = radial::kl_term<T>(static_cast<T>(mu[i]), r, q, kl_prior_at<T, kFull>(p0, m, s, i, sqrt_d, c1));
    }
  }
}

// g_rho = sigmoid(rho) acc_ge and (kLocGrad) g_mu = acc_g, each plus g_kl times the KL's
// derivatives (kWithKl); rounded once.
template <typename scalar_t, typename T, bool kLocGrad, bool kWithKl, bool kFull>
void finish_chunk(T g_kl, const scalar_t* mu, const scalar_t* rho, const radial::KlPrior<T>& p0, const T* m,
                  const T* s, T sqrt_d, T c1, const double* acc_ge, const double* acc_g, int64_t n, scalar_t* g_mu,
                  scalar_t* g_rho) {
  for (int64_t i = 0; i < n; ++i) {
    const T r = static_cast<T>(rho[i]);
    const meanfield::Scale<T> q = meanfield::scale_of<T>(r);
    T a = T(0), b = T(0);
    if constexpr (kWithKl) {
      radial::kl_grads<T>(g_kl, static_cast<T>(mu[i]), r, q, kl_prior_at<T, kFull>(p0, m, s, i, sqrt_d, c1), &a, &b);
    }
    g_rho[i] = static_cast<scalar_t>(static_cast<double>(q.sigmoid) * acc_ge[i] + static_cast<double>(b));
    if constexpr (kLocGrad) g_mu[i] = static_cast<scalar_t>(acc_g[i] + static_cast<double>(a));
  }
}

// f.template operator()<kWithKl, kFull>() (kFull: a prior with a per-element loc or scale).
template <class F>
void dispatch_kl(bool with_kl, bool full, const F& f) {
  if (!with_kl) {
    f.template operator()<false, false>();
  } else if (full) {
    f.template operator()<true, true>();
  } else {
    f.template operator()<true, false>();
  }
}

// The prior's operands of one chunk [start, start + n) in the op-math type: m and s (chunk-sized
// buffers, the single-element one repeated) when the prior has a per-element part.
template <typename scalar_t, typename T>
struct ChunkPrior {
  const scalar_t *m, *s;
  bool m_full, s_full, full;
  radial::KlPrior<T> p0;
  T sqrt_d, c1;

  ChunkPrior(const meanfield::Operands& x, int64_t D)
      : m(x.with_kl() ? x.prior_loc.const_data_ptr<scalar_t>() : nullptr),
        s(x.with_kl() ? x.prior_scale.const_data_ptr<scalar_t>() : nullptr),
        m_full(x.with_kl() && x.prior_loc.numel() != 1),
        s_full(x.with_kl() && x.prior_scale.numel() != 1),
        full(m_full || s_full),
        p0{},
        sqrt_d(static_cast<T>(::sqrt(static_cast<double>(D)))),
        c1(static_cast<T>(1.0 - 1.0 / static_cast<double>(D))) {
    if (m != nullptr) p0 = radial::kl_prior_of<T>(static_cast<T>(m[0]), static_cast<T>(s[0]), sqrt_d, c1);
  }

  void fill(int64_t start, int64_t n, T* mb, T* sb) const {
    if (!full) return;
    for (int64_t i = 0; i < n; ++i) {
      mb[i] = static_cast<T>(m_full ? m[start + i] : m[0]);
      sb[i] = static_cast<T>(s_full ? s[start + i] : s[0]);
    }
  }
};

// Pass 1 of the noise (whole event or rows): the normals of every stream t into out (and into
// noise when kept), each chunk's sum of squares; then coef[t] = r_t / |eps_t| from the chunk sums
// added in order.
template <typename scalar_t>
void draw_eps(scalar_t* po, scalar_t* pn, double* pc, int64_t streams, int64_t length, uint64_t sd, uint64_t of) {
  const int64_t nchunk = (length + kRadialChunk - 1) / kRadialChunk;
  const int64_t units = streams * nchunk;
  std::vector<double> partial(static_cast<size_t>(units));
  const int64_t grain = std::max<int64_t>(1, 65536 / kRadialChunk);
  for_each_chunk(units, nchunk, length, grain, [&](int64_t u, int64_t t, int64_t start, int64_t n) {
    scalar_t* dst = po + t * length + start;  // (s, g) is contiguous: t * L
    fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(t), static_cast<uint32_t>(start / 4), n, dst);
    partial[static_cast<size_t>(u)] = sum_squares(dst, n);
    if (pn != nullptr) std::copy(dst, dst + n, pn + t * length + start);  // kept for the backward
  });
  at::parallel_for(0, streams, 256, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      double ss = 0.0;
      for (int64_t c = 0; c < nchunk; ++c) ss += partial[static_cast<size_t>(t * nchunk + c)];
      pc[t] = radial::group_coef(sd, of, static_cast<uint64_t>(t), ss);
    }
  });
}

// dst[i] = loc[i] + scale[i] * (dst[i] * k) in double, rounded once (scale_t: the input's type or
// the op-math type of a computed scale).
template <typename scalar_t, typename scale_t>
VMF_FORCEINLINE void combine(scalar_t* dst, const scalar_t* loc, const scale_t* scale, double k, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<scalar_t>(static_cast<double>(loc[i]) +
                                   static_cast<double>(scale[i]) * (static_cast<double>(dst[i]) * k));
  }
}

struct CpuRadial : CpuSeeds {
  static void noise(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, const at::Tensor& loc,
                    const at::Tensor& scale, const RadialLayout& lay, const SeedOffset& so) {
    const int64_t streams = out.size(0) * lay.groups;
    const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
    const int64_t units = streams * nchunk;
    double* pc = coef.mutable_data_ptr<double>();
    const uint64_t sd = so.seed, of = so.offset;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "radial_noise", [&] {
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      scalar_t* pn = noise.numel() > 0 ? noise.mutable_data_ptr<scalar_t>() : nullptr;
      const scalar_t* pm = loc.const_data_ptr<scalar_t>();
      const scalar_t* ps = scale.const_data_ptr<scalar_t>();
      draw_eps<scalar_t>(po, pn, pc, streams, lay.length, sd, of);
      const int64_t grain = std::max<int64_t>(1, 65536 / kRadialChunk);
      // pass 2: out = loc + scale * eps * coef, in double, rounded once
      for_each_chunk(units, nchunk, lay.length, grain, [&](int64_t, int64_t t, int64_t start, int64_t n) {
        scalar_t* dst = po + t * lay.length + start;
        const int64_t j0 = (t % lay.groups) * lay.length + start;  // position in the event
        combine(dst, pm + j0, ps + j0, pc[t], n);
      });
    });
  }

  static void scale_grad(at::Tensor& out, const at::Tensor& grad, const at::Tensor& coef, const at::Tensor& noise,
                         const RadialLayout& lay, const SeedOffset& so) {
    const int64_t S = grad.size(0);
    const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
    const int64_t units = lay.groups * nchunk;
    const double* pc = coef.const_data_ptr<double>();
    const uint64_t sd = so.seed, of = so.offset;
    const int64_t event = lay.groups * lay.length;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "radial_noise_scale_grad", [&] {
      const scalar_t* pg = grad.const_data_ptr<scalar_t>();
      const scalar_t* pn = noise.defined() ? noise.const_data_ptr<scalar_t>() : nullptr;
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, units, 1, [&](int64_t b, int64_t e) {
        std::vector<scalar_t> eps(static_cast<size_t>(kRadialChunk));
        std::vector<double> acc(static_cast<size_t>(kRadialChunk));
        scalar_t* pe = eps.data();
        double* pa = acc.data();
        isa::dispatch([&] {
          for (int64_t u = b; u < e; ++u) {
            const int64_t g = u / nchunk, c = u % nchunk;
            const int64_t start = c * kRadialChunk;
            const int64_t n = std::min(kRadialChunk, lay.length - start);
            const int64_t j0 = g * lay.length + start;
            for (int64_t i = 0; i < n; ++i) pa[i] = 0.0;
            for (int64_t s = 0; s < S; ++s) {
              const int64_t t = s * lay.groups + g;
              const scalar_t* es = pe;  // the eps of this chunk: kept by the forward pass, or regenerated
              if (pn != nullptr) {
                es = pn + s * event + j0;
              } else {
                fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(t), static_cast<uint32_t>(start / 4),
                                                    n, pe);
              }
              const double k = pc[t];
              const scalar_t* gs = pg + s * event + j0;
              for (int64_t i = 0; i < n; ++i) pa[i] += static_cast<double>(gs[i]) * (static_cast<double>(es[i]) * k);
            }
            for (int64_t i = 0; i < n; ++i) po[j0 + i] = static_cast<scalar_t>(pa[i]);
          }
        });
      });
    });
  }

  // Pass 1 as noise's; pass 2 chunk by chunk of the event: softplus(rho) (and the KL terms) once,
  // then every sample's out = loc + sigma * eps * coef.
  static void sample(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, at::Tensor& kl,
                     const meanfield::Operands& x, double kl_offset, const SeedOffset& so) {
    const int64_t S = out.size(0), D = x.rho.numel();
    const int64_t nchunk = (D + kRadialChunk - 1) / kRadialChunk;
    const bool with_kl = x.with_kl();
    std::vector<double> kl_part(static_cast<size_t>(with_kl ? nchunk : 0), 0.0);
    double* pc = coef.mutable_data_ptr<double>();
    const uint64_t sd = so.seed, of = so.offset;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "radial_sample", [&] {
      using T = at::opmath_type<scalar_t>;
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      scalar_t* pn = noise.numel() > 0 ? noise.mutable_data_ptr<scalar_t>() : nullptr;
      const scalar_t* pm = x.loc.const_data_ptr<scalar_t>();
      const scalar_t* pr = x.rho.const_data_ptr<scalar_t>();
      const ChunkPrior<scalar_t, T> prior(x, D);
      if (S > 0) draw_eps<scalar_t>(po, pn, pc, S, D, sd, of);
      const int64_t grain = std::max<int64_t>(1, 65536 / (kRadialChunk * std::max<int64_t>(S, 1)));
      for_each_chunk(nchunk, nchunk, D, grain, [&](int64_t c, int64_t, int64_t start, int64_t n) {
        const std::unique_ptr<T[]> buf(new T[4 * kRadialChunk]);  // (uninitialised: written before read)
        T *sigma = buf.get(), *terms = sigma + kRadialChunk, *mb = terms + kRadialChunk, *sb = mb + kRadialChunk;
        prior.fill(start, n, mb, sb);
        dispatch_kl(with_kl, prior.full, [&]<bool kWithKl, bool kFull>() {
          scale_kl_chunk<scalar_t, T, kWithKl, kFull>(pm + start, pr + start, prior.p0, mb, sb, prior.sqrt_d,
                                                      prior.c1, n, sigma, terms);
        });
        if (with_kl) kl_part[static_cast<size_t>(c)] = sum_chunk<T>(terms, n);
        for (int64_t s = 0; s < S; ++s) combine(po + s * D + start, pm + start, sigma, pc[s], n);
      });
    });
    if (with_kl) fill_total(kl, kl_part, kl_offset);
  }

  // Chunk by chunk of the event: acc_ge = sum_s grad[s] eps_s coef_s and acc_g = sum_s grad[s]
  // in double (eps read back or regenerated), then the gradients with the KL's.
  static void sample_backward(at::Tensor& g_loc, at::Tensor& g_rho, const at::Tensor& grad, const at::Tensor& coef,
                              const at::Tensor& noise, const meanfield::Operands& x, const at::Tensor& grad_kl,
                              const SeedOffset& so) {
    const int64_t S = grad.size(0), D = x.rho.numel();
    const int64_t nchunk = (D + kRadialChunk - 1) / kRadialChunk;
    const bool with_kl = x.with_kl(), loc_grad = g_loc.numel() > 0;
    const double gkl = with_kl ? grad_kl.item<double>() : 0.0;
    const double* pc = coef.const_data_ptr<double>();
    const uint64_t sd = so.seed, of = so.offset;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "radial_sample_backward", [&] {
      using T = at::opmath_type<scalar_t>;
      const scalar_t* pg = grad.const_data_ptr<scalar_t>();
      const scalar_t* pn = noise.defined() ? noise.const_data_ptr<scalar_t>() : nullptr;
      const scalar_t* pm = x.loc.const_data_ptr<scalar_t>();
      const scalar_t* pr = x.rho.const_data_ptr<scalar_t>();
      scalar_t* gm = loc_grad ? g_loc.mutable_data_ptr<scalar_t>() : nullptr;
      scalar_t* gr = g_rho.mutable_data_ptr<scalar_t>();
      const ChunkPrior<scalar_t, T> prior(x, D);
      const T g_kl = static_cast<T>(gkl);
      const int64_t grain = std::max<int64_t>(1, 65536 / (kRadialChunk * std::max<int64_t>(S, 1)));
      for_each_chunk(nchunk, nchunk, D, grain, [&](int64_t, int64_t, int64_t start, int64_t n) {
        // (uninitialised but the sums, which start at zero: the rest is written before it is read)
        std::vector<double> acc(static_cast<size_t>(2 * kRadialChunk), 0.0);
        const std::unique_ptr<scalar_t[]> eps(pn == nullptr ? new scalar_t[kRadialChunk] : nullptr);
        const std::unique_ptr<T[]> pbuf(prior.full ? new T[2 * kRadialChunk] : nullptr);
        double *acc_ge = acc.data(), *acc_g = acc_ge + kRadialChunk;
        for (int64_t s = 0; s < S; ++s) {
          const scalar_t* es = eps.get();
          if (pn != nullptr) {
            es = pn + s * D + start;
          } else {
            fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(s), static_cast<uint32_t>(start / 4), n,
                                                eps.get());
          }
          const double k = pc[s];
          const scalar_t* g = pg + s * D + start;
          for (int64_t i = 0; i < n; ++i) {
            const double gi = static_cast<double>(g[i]);
            acc_ge[i] += gi * (static_cast<double>(es[i]) * k);
            acc_g[i] += gi;
          }
        }
        T *mb = pbuf.get(), *sb = prior.full ? mb + kRadialChunk : nullptr;
        prior.fill(start, n, mb, sb);
        dispatch_kl(with_kl, prior.full, [&]<bool kWithKl, bool kFull>() {
          if (loc_grad) {
            finish_chunk<scalar_t, T, true, kWithKl, kFull>(g_kl, pm + start, pr + start, prior.p0, mb, sb,
                                                            prior.sqrt_d, prior.c1, acc_ge, acc_g, n, gm + start,
                                                            gr + start);
          } else {
            finish_chunk<scalar_t, T, false, kWithKl, kFull>(g_kl, pm + start, pr + start, prior.p0, mb, sb,
                                                             prior.sqrt_d, prior.c1, acc_ge, acc_g, n, nullptr,
                                                             gr + start);
          }
        });
      });
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("radial_noise", &radial::Ops<CpuRadial>::noise);
  m.impl("radial_noise_scale_grad", &radial::Ops<CpuRadial>::scale_grad);
  m.impl("radial_sample", &radial::Ops<CpuRadial>::sample);
  m.impl("radial_sample_backward", &radial::Ops<CpuRadial>::sample_backward);
}

}  // namespace vmfdist
