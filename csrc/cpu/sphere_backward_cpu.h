// The CPU backward of the samplers on the sphere shared by the von Mises-Fisher (vmf_cpu.cpp) and
// power spherical (power_spherical_cpu.cpp) ops: the three passes of vmf::Ops::sample_backward
// (host/vmf_host.h), with the gradient through the reflection of vmf.h, which the two samplers
// share, and d/dkappa = sum over samples of dL/dw * dw/dkappa, where only dw/dkappa, the implicit
// reparameterisation gradient of the marginal, differs.  The template parameter G gives it: one G
// is made per parallel_for task,
//
//   struct G { G(double d, bool single);   // single: the result is rounded to float32 or narrower
//              double operator()(double omw, double kappa); };   // dw/dkappa at w = 1 - omw
//
// so a G may keep state between the rows of a task (both cache what depends on kappa alone).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "vmfdist/isa_dispatch.h"
#include "vmfdist/vmf.h"

namespace vmfdist {
namespace sphere_cpu {

// sum_{i>=1} mu_i e_i (mu_i = loc_i f) for e = x and e = g, 8 double accumulators each.
template <class scalar_t>
inline void tail_dots(const scalar_t* loc, const scalar_t* x, const scalar_t* g, int64_t d, double f, double* mx,
                      double* mg) {
  double a[8] = {0}, b[8] = {0};
  int64_t i = 1;
  for (; i + 8 <= d; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double m = static_cast<double>(loc[i + l]) * f;
      a[l] += m * static_cast<double>(x[i + l]);
      b[l] += m * static_cast<double>(g[i + l]);
    }
  }
  for (int l = 0; l < 8; ++l) {
    if (i + l < d) {
      const double m = static_cast<double>(loc[i + l]) * f;
      a[l] += m * static_cast<double>(x[i + l]);
      b[l] += m * static_cast<double>(g[i + l]);
    }
  }
  *mx = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  *mg = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
}

// sum_{i>=1} (Q g)_i y_i = sum (sgn g_i + mu_i q)(sgn x_i + mu_i a).
template <class scalar_t>
inline double tail_tangent(const scalar_t* loc, const scalar_t* x, const scalar_t* g, int64_t d, double f, double sgn,
                           double a, double q) {
  double acc[8] = {0};
  int64_t i = 1;
  for (; i + 8 <= d; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double m = static_cast<double>(loc[i + l]) * f;
      acc[l] += (sgn * static_cast<double>(g[i + l]) + m * q) * (sgn * static_cast<double>(x[i + l]) + m * a);
    }
  }
  for (int l = 0; l < 8; ++l) {
    if (i + l < d) {
      const double m = static_cast<double>(loc[i + l]) * f;
      acc[l] += (sgn * static_cast<double>(g[i + l]) + m * q) * (sgn * static_cast<double>(x[i + l]) + m * a);
    }
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline vmf::LocFrame frame_at(const double* pf, int64_t b) { return {pf[3 * b], pf[3 * b + 1], pf[3 * b + 2]}; }

// The passes of vmf::Ops::sample_backward (host/vmf_host.h, shared with CUDA) for the marginal
// gradient G.
template <class G>
struct Backward {
  static void frames(at::Tensor& frame, const at::Tensor& loc) {
    const int64_t B = loc.size(0), d = loc.size(1);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      const scalar_t* pl = loc.const_data_ptr<scalar_t>();
      double* pf = frame.mutable_data_ptr<double>();
      at::parallel_for(0, B, std::max<int64_t>(1, 16384 / d), [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const scalar_t* mu = pl + b * d;
          double mm = 0.0;
          for (int64_t i = 0; i < d; ++i) mm += static_cast<double>(mu[i]) * static_cast<double>(mu[i]);
          double scale = 1.0;
          if (vmf::loc_needs_scaling(mm)) {
            double mx = 0.0;
            for (int64_t i = 0; i < d; ++i) mx = std::max(mx, std::fabs(static_cast<double>(mu[i])));
            scale = vmf::loc_scale(mx);
            mm = 0.0;
            for (int64_t i = 0; i < d; ++i) {
              const double m = static_cast<double>(mu[i]) * scale;
              mm += m * m;
            }
          }
          const vmf::LocFrame t = vmf::loc_frame(mm, scale, static_cast<double>(mu[0]));
          pf[3 * b] = t.f;
          pf[3 * b + 1] = t.sgn;
          pf[3 * b + 2] = t.den;
        }
      });
    });
  }

  static void rows(at::Tensor& rows, const at::Tensor& grad_x, const at::Tensor& grad_omw, const at::Tensor& x,
                   const at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa, const at::Tensor& frame,
                   bool concentration_grad) {
    const int64_t B = loc.size(0), d = loc.size(1), nrows = x.size(0) * B;
    const double dd = static_cast<double>(d);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      const scalar_t* pl = loc.const_data_ptr<scalar_t>();
      const scalar_t* pk = kappa.const_data_ptr<scalar_t>();
      const scalar_t* px = x.const_data_ptr<scalar_t>();
      const scalar_t* pg = grad_x.const_data_ptr<scalar_t>();
      const scalar_t* po = omw.const_data_ptr<scalar_t>();
      const scalar_t* pgo = grad_omw.defined() ? grad_omw.const_data_ptr<scalar_t>() : nullptr;
      const double* pf = frame.const_data_ptr<double>();
      double* pr = rows.mutable_data_ptr<double>();
      constexpr bool single = sizeof(scalar_t) <= sizeof(float);
      // the quadrature of dw/dkappa dominates a row: small grains
      const int64_t grain = concentration_grad ? 8 : std::max<int64_t>(1, 16384 / d);
      at::parallel_for(0, nrows, grain, [&](int64_t begin, int64_t end) {
        isa::dispatch([&] {
          G dw_dkappa(dd, single);
          for (int64_t r = begin; r < end; ++r) {
            const int64_t b = r % B;
            const vmf::LocFrame t = frame_at(pf, b);
            const scalar_t* mu = pl + b * d;
            const scalar_t* xr = px + r * d;
            const scalar_t* gr = pg + r * d;
            double mx, mg;
            tail_dots<scalar_t>(mu, xr, gr, d, t.f, &mx, &mg);
            const double x0 = static_cast<double>(xr[0]), g0 = static_cast<double>(gr[0]);
            const vmf::RowBackward rb = vmf::row_backward(t, x0, g0, vmf::v_dot(t, x0, mx), vmf::v_dot(t, g0, mg));
            double gk = 0.0;
            if (concentration_grad) {
              const double om = static_cast<double>(po[r]);
              const double kap = static_cast<double>(pk[b]);
              const double tang = tail_tangent<scalar_t>(mu, xr, gr, d, t.f, t.sgn, rb.a, rb.q);
              const double dl = vmf::marginal_dl_dw(rb.gq0, tang, om, pgo ? static_cast<double>(pgo[r]) : 0.0);
              gk = dl * dw_dkappa(om, kap);
            }
            pr[3 * r] = rb.a;
            pr[3 * r + 1] = rb.q;
            pr[3 * r + 2] = gk;
          }
        });
      });
    });
  }

  static void reduce(const at::Tensor& grad_loc, const at::Tensor& grad_kappa, const at::Tensor& rows,
                     const at::Tensor& grad_x, const at::Tensor& x, const at::Tensor& loc, const at::Tensor& frame) {
    const int64_t n = x.size(0), B = loc.size(0), d = loc.size(1);
    const bool want_loc = grad_loc.defined(), want_kappa = grad_kappa.defined();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      const scalar_t* pl = loc.const_data_ptr<scalar_t>();
      const scalar_t* px = x.const_data_ptr<scalar_t>();
      const scalar_t* pg = grad_x.const_data_ptr<scalar_t>();
      const double* pf = frame.const_data_ptr<double>();
      const double* pr = rows.const_data_ptr<double>();
      scalar_t* pgl = want_loc ? grad_loc.mutable_data_ptr<scalar_t>() : nullptr;
      scalar_t* pgk = want_kappa ? grad_kappa.mutable_data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, B, std::max<int64_t>(1, 16384 / (d * n)), [&](int64_t begin, int64_t end) {
        std::vector<double> gm(want_loc ? static_cast<size_t>(d) : 0);
        isa::dispatch([&] {
          for (int64_t b = begin; b < end; ++b) {
            const vmf::LocFrame t = frame_at(pf, b);
            const scalar_t* mu = pl + b * d;
            if (want_kappa) {
              double gk = 0.0;
              for (int64_t s = 0; s < n; ++s) gk += pr[3 * (s * B + b) + 2];
              pgk[b] = static_cast<scalar_t>(gk);
            }
            if (!want_loc) continue;
            double* pm = gm.data();
            for (int64_t i = 0; i < d; ++i) pm[i] = 0.0;
            for (int64_t s = 0; s < n; ++s) {
              const int64_t r = s * B + b;
              const double a = pr[3 * r], q = pr[3 * r + 1];
              const double sa = -t.sgn * a;
              const scalar_t* xr = px + r * d;
              const scalar_t* gr = pg + r * d;
              const double y0 = t.sgn * (static_cast<double>(xr[0]) - a * t.den);
              pm[0] += sa * static_cast<double>(gr[0]) + q * y0 - sa * q;
              for (int64_t i = 1; i < d; ++i) {
                const double y = t.sgn * static_cast<double>(xr[i]) + static_cast<double>(mu[i]) * t.f * a;
                pm[i] += sa * static_cast<double>(gr[i]) + q * y;
              }
            }
            double dot = 0.0;
            for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(mu[i]) * t.f * pm[i];
            scalar_t* out = pgl + b * d;
            for (int64_t i = 0; i < d; ++i) {
              out[i] = static_cast<scalar_t>(t.f * (pm[i] - static_cast<double>(mu[i]) * t.f * dot));
            }
          }
        });
      });
    });
  }
};

}  // namespace sphere_cpu
}  // namespace vmfdist
