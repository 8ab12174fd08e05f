// CPU kernels for the von Mises-Fisher ops: at::parallel_for over sample rows (the
// backward: over sample rows, then over batch rows for the sums over samples), each row
// computed by the host-device math of vmfdist/vmf.h.  A row depends
// only on (seed, offset, row index), so any thread count gives the same tensor.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "vmfdist/fast_normal.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/vmf.h"
#include "host/random_state.h"
#include "host/vmf_host.h"

namespace vmfdist {
namespace {

// Pass 1 of a row (the normals are in e[0..n)): |e|^2, mu.e and |mu|^2 over the same
// entries, with 8 independent double accumulators so the loop vectorises.
template <class scalar_t>
inline void row_sums(const scalar_t* e, const scalar_t* mu, int64_t n, double* ee, double* me, double* mm) {
  double a[8] = {0}, b[8] = {0}, c[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double ed = static_cast<double>(e[i + l]), md = static_cast<double>(mu[i + l]);
      a[l] += ed * ed;
      b[l] += md * ed;
      c[l] += md * md;
    }
  }
  for (int l = 0; l < 8; ++l) {  // the tail; constant lane indices keep the accumulators in registers
    if (i + l < n) {
      const double ed = static_cast<double>(e[i + l]), md = static_cast<double>(mu[i + l]);
      a[l] += ed * ed;
      b[l] += md * ed;
      c[l] += md * md;
    }
  }
  *ee = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  *me = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
  *mm = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

// Pass 2 of a row: x_i = sy e_i + mu_i c, in double, rounded once.
template <class scalar_t>
inline void row_rotate(scalar_t* x, const scalar_t* mu, int64_t n, double sy, double c) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<scalar_t>(sy * static_cast<double>(x[i]) + static_cast<double>(mu[i]) * c);
  }
}

// One sample row, its d - 1 tangent normals already in x[1..d-1]: the marginal from
// the stream (seed, offset, row) (Wood's envelope p for this kappa precomputed), then
// the reflection applied in place.  mu is normalised on the fly (robust to loc that is
// unit only to rounding).
template <class scalar_t>
void finish_row(const scalar_t* mu, double kappa, const vmf::Wood& p, int64_t d, uint64_t seed, uint64_t offset,
                uint64_t row, scalar_t* x, scalar_t* omw_out) {
  philox::PhiloxStream s(seed, offset, row);
  const vmf::Marginal m = vmf::sample_marginal(s, static_cast<double>(d), kappa, p);
  const int64_t nt = d - 1;
  double ee = 0.0, me = 0.0, mm = 0.0;
  row_sums<scalar_t>(x + 1, mu + 1, nt, &ee, &me, &mm);
  mm += static_cast<double>(mu[0]) * static_cast<double>(mu[0]);
  double mu_scale = 1.0;  // loc is used as mu_i mu_scale (vmf.h: loc_needs_scaling)
  if (vmf::loc_needs_scaling(mm)) {
    double mx = 0.0;
    for (int64_t i = 0; i < d; ++i) mx = std::max(mx, std::fabs(static_cast<double>(mu[i])));
    mu_scale = vmf::loc_scale(mx);
    me = 0.0;
    mm = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const double mi = static_cast<double>(mu[i]) * mu_scale;
      mm += mi * mi;
      if (i > 0) me += mi * static_cast<double>(x[i]);
    }
  }
  const vmf::RowRotation t =
      vmf::row_rotation(m.w, m.omw, m.opw, ee, me, mm, static_cast<double>(mu[0]) * mu_scale);
  x[0] = static_cast<scalar_t>(t.x0);
  if (mu_scale == 1.0) {
    row_rotate<scalar_t>(x + 1, mu + 1, nt, t.sy, t.c);
  } else {
    for (int64_t i = 1; i < d; ++i) {
      x[i] = static_cast<scalar_t>(t.sy * static_cast<double>(x[i]) + (static_cast<double>(mu[i]) * mu_scale) * t.c);
    }
  }
  *omw_out = static_cast<scalar_t>(m.omw);
}

// Rows are processed kRowGroup at a time.  Float32 rows with at most kShortRow tangent
// normals draw them for the whole group at once (normals_f32_rows: the blocks of several
// rows share the vector lanes); longer rows, and other dtypes, row by row through
// fill_normals.  The values are the same either way.  (Computing the first Philox
// blocks of the marginal streams in lanes as well was measured slower: the scalar
// blocks overlap with the marginal's libm calls.)
constexpr int64_t kRowGroup = 16;
constexpr int64_t kShortRow = 16;

// Rows [begin, end): the tangent normals of each row from the stream (seed, offset + 1,
// row) (fast_normal.h), then finish_row with the marginal from (seed, offset, row).
// Wood's envelope is recomputed only when kappa changes from one row to the next.
// Called through isa::dispatch (isa_dispatch.h), so the vectorised normals and row passes
// run in the AVX2 + FMA copy where the CPU has it.
template <class scalar_t>
void sample_rows(const scalar_t* pm, const scalar_t* pk, int64_t B, int64_t d, uint64_t seed, uint64_t offset,
                 int64_t begin, int64_t end, scalar_t* px, scalar_t* po) {
  const int64_t nt = d - 1;
  const double dd = static_cast<double>(d);
  double kappa_cached = NAN;
  vmf::Wood wood{};
  float buf[kRowGroup * kShortRow + 4 * fast_normal::kLanes];
  const bool short_rows = std::is_same_v<scalar_t, float> && nt <= kShortRow;
  const uint32_t nb = static_cast<uint32_t>((nt + 3) / 4);
  for (int64_t g = begin; g < end; g += kRowGroup) {
    const int64_t rows = std::min<int64_t>(kRowGroup, end - g);
    if (short_rows) fast_normal::normals_f32_rows(seed, offset + 1, static_cast<uint64_t>(g), rows, nb, buf);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = g + r;
      scalar_t* x = px + row * d;
      if (short_rows) {
        std::memcpy(x + 1, buf + 4 * nb * r, sizeof(float) * nt);  // scalar_t is float here
      } else {
        fast_normal::fill_normals<scalar_t>(seed, offset + 1, static_cast<uint64_t>(row), 0, nt, x + 1);
      }
      const int64_t b = row % B;
      const double kappa = static_cast<double>(pk[b]);
      if (!(kappa == kappa_cached) && d != 3) {  // NaN never equals: recomputed, harmless
        wood = vmf::wood_setup(dd, kappa);
        kappa_cached = kappa;
      }
      finish_row<scalar_t>(pm + b * d, kappa, wood, d, seed, offset, static_cast<uint64_t>(row), x, po + row);
    }
  }
}

// ---- vmf_sample_backward (vmf.h: the backward of vmf_sample) ----

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

// The passes of vmf::Ops::sample_backward (host/vmf_host.h, shared with CUDA).
struct CpuVmfBackward {
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
      // the quadrature of dw/dkappa dominates a row: small grains
      const int64_t grain = concentration_grad ? 8 : std::max<int64_t>(1, 16384 / d);
      at::parallel_for(0, nrows, grain, [&](int64_t begin, int64_t end) {
        isa::dispatch([&] {
          double kappa_cached = NAN, c = NAN;  // 1 - A_d(kappa) for the last kappa seen
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
              if (!(kap == kappa_cached)) {  // NaN never equals: recomputed, harmless
                c = kap >= 0.0 && !is_inf(kap) ? bessel::iv_ratio(0.5 * dd, kap, true) : NAN;  // else unused
                kappa_cached = kap;
              }
              gk = dl * vmf::dw_dkappa_c(om, kap, dd, c);
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

// The kernel of vmf::Ops (host/vmf_host.h, shared with CUDA).
struct CpuVmf : CpuSeeds, CpuVmfBackward {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const SeedOffset& so) {
    const uint64_t seed = so.seed, offset = so.offset;
    const int64_t B = loc.size(0), d = loc.size(1), rows = x.size(0) * B;
    const int64_t grain = std::max<int64_t>(1, 16384 / d);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample", [&] {
      const scalar_t* pm = loc.const_data_ptr<scalar_t>();
      const scalar_t* pk = kappa.const_data_ptr<scalar_t>();
      scalar_t* px = x.mutable_data_ptr<scalar_t>();
      scalar_t* po = omw.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        isa::dispatch([&] { sample_rows<scalar_t>(pm, pk, B, d, seed, offset, begin, end, px, po); });
      });
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("vmf_sample", &vmf::Ops<CpuVmf>::sample);
  m.impl("vmf_sample_backward", &vmf::Ops<CpuVmf>::sample_backward);
}

}  // namespace vmfdist
