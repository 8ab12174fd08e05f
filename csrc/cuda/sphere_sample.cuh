// The CUDA sampler shared by the von Mises-Fisher (vmf_cuda.cu) and power spherical
// (power_spherical_cuda.cu) ops: both draw x = Q(mu) (w, sqrt(1 - w^2) e / |e|) with the marginal
// w from the stream (seed, offset, row), the tangent normals e from (seed, offset + 1, row)
// (vmfdist/vmf.h, "Randomness") and the reflection of vmf::row_rotation; they differ only in
// the marginal, which the template parameter M gives:
//
//   struct M { static constexpr const char* name = "the op";  // for dtype-dispatch errors
//              static __device__ vmf::Marginal draw(uint64_t seed, uint64_t offset, uint64_t row,
//                                                   double d, double kappa); };
//
// Two kernels, chosen by the row length (launch_sphere_sample):
//   * short rows (d - 1 <= kThreadRowMax tangent normals): one thread per row, the whole row
//     in registers and the L1 cache, every lane busy;
//   * longer rows: one warp per row for the normals, the sums (shuffles) and the rotation
//     (lane l takes Philox blocks l, l + 32, ... of the tangent stream), and the marginals
//     drawn `rpw` rows at a time, one per lane, before the warp walks those rows.  The
//     rejection loop (Wood's, or two Gamma variates) costs as much as hundreds of normals;
//     drawn by lane 0 alone it left 31 lanes idle for most of a row.  rpw is chosen on the
//     host so that the grid still fills the device (at most 32).
// A row depends only on (seed, offset, row) and the inputs, so both kernels and every rpw
// give the same normals and marginal bits as the CPU loop; the sums (and hence the last bit of
// a rotated entry) may round differently.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

#include "vmfdist/fast_normal.h"
#include "vmfdist/vmf.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace sphere {

using launch::kThreads;
using launch::kWarp;

// Rows with at most this many tangent normals take the thread-per-row kernel.
constexpr int64_t kThreadRowMax = 16;

__device__ inline double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Philox block j of row `row`'s tangent stream (seed, offset + 1, row): its normals below nt written
// to xr[1 + 4j ..], and |e|^2, mu.e and |mu|^2 over those entries added to ee, me, mm.
template <class scalar_t>
__device__ inline void tangent_block(uint64_t seed, uint64_t offset, int64_t row, int64_t j, int64_t nt,
                                     const scalar_t* __restrict__ mu, scalar_t* __restrict__ xr, double& ee,
                                     double& me, double& mm) {
  double z[4];
  fast_normal::normal4_for<scalar_t>(seed, offset + 1, static_cast<uint64_t>(row), static_cast<uint32_t>(j), z);
  for (int k = 0; k < 4; ++k) {
    const int64_t idx = 4 * j + k;
    if (idx < nt) {
      const scalar_t e = static_cast<scalar_t>(z[k]);
      const double ed = static_cast<double>(e);
      const double mi = static_cast<double>(mu[1 + idx]);
      xr[1 + idx] = e;
      ee += ed * ed;
      me += mi * ed;
      mm += mi * mi;
    }
  }
}

// One row by one warp, given its marginal (the same on every lane).
template <class scalar_t>
__device__ inline void warp_row(int lane, int64_t row, double w, double omw, double opw,
                                const scalar_t* __restrict__ loc, scalar_t* __restrict__ x,
                                scalar_t* __restrict__ omw_out, int64_t B, int64_t d, uint64_t seed, uint64_t offset) {
  const int64_t nt = d - 1;
  const int64_t nblk = (nt + 3) / 4;
  const scalar_t* mu = loc + (row % B) * d;
  scalar_t* xr = x + row * d;
  double ee = 0.0, me = 0.0, mm = 0.0;
  for (int64_t j = lane; j < nblk; j += kWarp) tangent_block(seed, offset, row, j, nt, mu, xr, ee, me, mm);
  if (lane == 0) mm += static_cast<double>(mu[0]) * static_cast<double>(mu[0]);
  ee = warp_sum(ee);
  me = warp_sum(me);
  mm = warp_sum(mm);
  double mu_scale = 1.0;  // loc is used as mu_i mu_scale (vmf.h: loc_needs_scaling)
  if (vmf::loc_needs_scaling(mm)) {  // the same on every lane of the warp
    double mx = 0.0;
    for (int64_t i = lane; i < d; i += kWarp) mx = ::fmax(mx, ::fabs(static_cast<double>(mu[i])));
    for (int o = kWarp / 2; o > 0; o >>= 1) mx = ::fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    mu_scale = vmf::loc_scale(mx);
    // the same entries per lane as above (each lane reads only the normals it wrote)
    me = 0.0;
    mm = 0.0;
    for (int64_t j = lane; j < nblk; j += kWarp) {
      for (int k = 0; k < 4; ++k) {
        const int64_t idx = 4 * j + k;
        if (idx < nt) {
          const double mi = static_cast<double>(mu[1 + idx]) * mu_scale;
          me += mi * static_cast<double>(xr[1 + idx]);
          mm += mi * mi;
        }
      }
    }
    if (lane == 0) {
      const double m0 = static_cast<double>(mu[0]) * mu_scale;
      mm += m0 * m0;
    }
    me = warp_sum(me);
    mm = warp_sum(mm);
  }
  // mm and me are sums over mu_i mu_scale: the reflection sees mu_0 mu_scale too
  const vmf::RowRotation t = vmf::row_rotation(w, omw, opw, ee, me, mm, static_cast<double>(mu[0]) * mu_scale);
  for (int64_t j = lane; j < nblk; j += kWarp) {
    for (int k = 0; k < 4; ++k) {
      const int64_t idx = 4 * j + k;
      if (idx < nt) {
        xr[1 + idx] = static_cast<scalar_t>(t.sy * static_cast<double>(xr[1 + idx]) +
                                            (static_cast<double>(mu[1 + idx]) * mu_scale) * t.c);
      }
    }
  }
  if (lane == 0) {
    xr[0] = static_cast<scalar_t>(t.x0);
    omw_out[row] = static_cast<scalar_t>(omw);
  }
}

// A warp per row, the marginals of rpw consecutive rows drawn side by side (lane l: row r0 + l).
template <class M, class scalar_t>
__global__ void warp_rows_kernel(const scalar_t* __restrict__ loc, const scalar_t* __restrict__ kappa,
                                 scalar_t* __restrict__ x, scalar_t* __restrict__ omw_out, int64_t rows, int64_t B,
                                 int64_t d, const int64_t* __restrict__ seed_offset, int rpw) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t groups = (rows + rpw - 1) / rpw;
  for (int64_t g : launch::warp_stride(groups)) {
    const int64_t r0 = g * rpw;
    const int nr = static_cast<int>(rows - r0 < rpw ? rows - r0 : rpw);  // the same on every lane
    double w = 0.0, omw = 0.0, opw = 0.0;
    if (lane < nr) {
      const int64_t row = r0 + lane;
      const vmf::Marginal m = M::draw(so.seed, so.offset, static_cast<uint64_t>(row), static_cast<double>(d),
                                      static_cast<double>(kappa[row % B]));
      w = m.w;
      omw = m.omw;
      opw = m.opw;
    }
    for (int k = 0; k < nr; ++k) {
      warp_row<scalar_t>(lane, r0 + k, __shfl_sync(0xffffffffu, w, k), __shfl_sync(0xffffffffu, omw, k),
                         __shfl_sync(0xffffffffu, opw, k), loc, x, omw_out, B, d, so.seed, so.offset);
    }
  }
}

// A thread per (short) row.
template <class M, class scalar_t>
__global__ void thread_rows_kernel(const scalar_t* __restrict__ loc, const scalar_t* __restrict__ kappa,
                                   scalar_t* __restrict__ x, scalar_t* __restrict__ omw_out, int64_t rows, int64_t B,
                                   int64_t d, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const int64_t nt = d - 1;
  const int64_t nblk = (nt + 3) / 4;
  for (int64_t row : launch::grid_stride(rows)) {
    const int64_t b = row % B;
    const scalar_t* mu = loc + b * d;
    scalar_t* xr = x + row * d;
    const vmf::Marginal m = M::draw(so.seed, so.offset, static_cast<uint64_t>(row), static_cast<double>(d),
                                    static_cast<double>(kappa[b]));
    double ee = 0.0, me = 0.0;
    double mm = static_cast<double>(mu[0]) * static_cast<double>(mu[0]);
    for (int64_t j = 0; j < nblk; ++j) tangent_block(so.seed, so.offset, row, j, nt, mu, xr, ee, me, mm);
    double mu_scale = 1.0;
    if (vmf::loc_needs_scaling(mm)) {
      double mx = 0.0;
      for (int64_t i = 0; i < d; ++i) mx = ::fmax(mx, ::fabs(static_cast<double>(mu[i])));
      mu_scale = vmf::loc_scale(mx);
      const double m0 = static_cast<double>(mu[0]) * mu_scale;
      me = 0.0;
      mm = m0 * m0;
      for (int64_t i = 1; i < d; ++i) {
        const double mi = static_cast<double>(mu[i]) * mu_scale;
        me += mi * static_cast<double>(xr[i]);
        mm += mi * mi;
      }
    }
    const vmf::RowRotation t =
        vmf::row_rotation(m.w, m.omw, m.opw, ee, me, mm, static_cast<double>(mu[0]) * mu_scale);
    for (int64_t i = 1; i < d; ++i) {
      xr[i] = static_cast<scalar_t>(t.sy * static_cast<double>(xr[i]) + (static_cast<double>(mu[i]) * mu_scale) * t.c);
    }
    xr[0] = static_cast<scalar_t>(t.x0);
    omw_out[row] = static_cast<scalar_t>(m.omw);
  }
}

// Rows per warp for the warp kernel: enough that the warps resident on every multiprocessor
// (64 of 32 lanes) have work with one group each, at most one per lane.
inline int rows_per_warp(int64_t rows) {
  const int64_t resident = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 64;
  const int64_t r = (rows + resident - 1) / resident;
  return static_cast<int>(r < 1 ? 1 : (r > kWarp ? kWarp : r));
}

// x (n, B, d) and omw (n, B) from loc (B, d) and kappa (B), contiguous, on the current device.
template <class M>
void launch_sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                   const int64_t* seed_offset) {
  const int64_t B = loc.size(0), d = loc.size(1), rows = x.size(0) * B;
  const auto stream = launch::stream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), M::name, [&] {
    if (d - 1 <= kThreadRowMax) {
      thread_rows_kernel<M, scalar_t><<<launch::blocks_for(rows), kThreads, 0, stream>>>(
          loc.const_data_ptr<scalar_t>(), kappa.const_data_ptr<scalar_t>(), x.mutable_data_ptr<scalar_t>(),
          omw.mutable_data_ptr<scalar_t>(), rows, B, d, seed_offset);
    } else {
      const int rpw = rows_per_warp(rows);
      warp_rows_kernel<M, scalar_t><<<launch::blocks_for((rows + rpw - 1) / rpw, kThreads / kWarp), kThreads, 0,
                                      stream>>>(
          loc.const_data_ptr<scalar_t>(), kappa.const_data_ptr<scalar_t>(), x.mutable_data_ptr<scalar_t>(),
          omw.mutable_data_ptr<scalar_t>(), rows, B, d, seed_offset, rpw);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace sphere
}  // namespace vmfdist
