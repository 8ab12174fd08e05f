// The CPU sampler on the sphere shared by the von Mises-Fisher (vmf_cpu.cpp) and power spherical
// (power_spherical_cpu.cpp) ops, the CPU twin of cuda/sphere_sample.cuh: both draw
// x = Q(mu) (w, sqrt(1 - w^2) e / |e|) with the marginal w from the stream (seed, offset, row),
// the tangent normals e from (seed, offset + 1, row) and vmf::row_rotation; they differ only in
// the marginal, which the template parameter M gives: one M is made per parallel_for task,
//
//   struct M { static constexpr const char* name = "the op";
//              explicit M(double d);
//              vmf::Marginal draw(philox::PhiloxStream& s, double kappa); };
//
// so a marginal may keep state between the rows of a task (the vMF's caches Wood's envelope
// while kappa stays the same).  A row depends only on (seed, offset, row), so any thread count
// gives the same tensor.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "vmfdist/fast_normal.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/philox.h"
#include "vmfdist/vmf.h"
#include "host/random_state.h"

namespace vmfdist {
namespace sphere_cpu {

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
// the stream (seed, offset, row) (drawn by the task's marginal m), then the reflection
// applied in place.  mu is normalised on the fly (robust to loc that is
// unit only to rounding).
template <class M, class scalar_t>
void finish_row(M& marginal, const scalar_t* mu, double kappa, int64_t d, uint64_t seed, uint64_t offset,
                uint64_t row, scalar_t* x, scalar_t* omw_out) {
  philox::PhiloxStream s(seed, offset, row);
  const vmf::Marginal m = marginal.draw(s, kappa);
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
// Called through isa::dispatch (isa_dispatch.h), so the vectorised normals and row passes
// run in the AVX2 + FMA copy where the CPU has it.
template <class M, class scalar_t>
void sample_rows(const scalar_t* pm, const scalar_t* pk, int64_t B, int64_t d, uint64_t seed, uint64_t offset,
                 int64_t begin, int64_t end, scalar_t* px, scalar_t* po) {
  const int64_t nt = d - 1;
  M marginal(static_cast<double>(d));
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
      finish_row(marginal, pm + b * d, static_cast<double>(pk[b]), d, seed, offset, static_cast<uint64_t>(row), x,
                 po + row);
    }
  }
}

// x (n, B, d) and omw (n, B) from loc (B, d) and kappa (B), contiguous, on the CPU.
template <class M>
void launch_sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                   const SeedOffset& so) {
  const uint64_t seed = so.seed, offset = so.offset;
  const int64_t B = loc.size(0), d = loc.size(1), rows = x.size(0) * B;
  const int64_t grain = std::max<int64_t>(1, 16384 / d);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), M::name, [&] {
    const scalar_t* pm = loc.const_data_ptr<scalar_t>();
    const scalar_t* pk = kappa.const_data_ptr<scalar_t>();
    scalar_t* px = x.mutable_data_ptr<scalar_t>();
    scalar_t* po = omw.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      isa::dispatch([&] { sample_rows<M, scalar_t>(pm, pk, B, d, seed, offset, begin, end, px, po); });
    });
  });
}

}  // namespace sphere_cpu
}  // namespace vmfdist
