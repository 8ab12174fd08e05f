// The CUDA backward shared by the von Mises-Fisher (vmf_cuda.cu) and power spherical
// (power_spherical_cuda.cu) samplers: the three passes of vmf::Ops::sample_backward
// (host/vmf_host.h) with the gradient through the reflection of vmf.h, which both samplers share,
// and d/dkappa = sum over samples of dL/dw * dw/dkappa, where only dw/dkappa, the implicit
// reparameterisation gradient of the marginal, differs.  The template parameter G gives it:
//
//   struct G { static __device__ double at(double omw, double kappa, double d); };  // dw/dkappa at w = 1 - omw
//
// (the CPU's twin is csrc/cpu/sphere_backward_cpu.h).  A warp per batch row for loc's frame, a
// warp per sample row for its coefficients, a thread per sample row for dw/dkappa (the
// quadrature), and the sums over samples in a fixed order (deterministic): a warp per (chunk of
// 256 samples, batch row, 32 entries of the row), then a warp per batch row over the chunks.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

#include "vmfdist/vmf.h"
#include "cuda/launch.cuh"
#include "cuda/sphere_sample.cuh"

namespace vmfdist {
namespace sphere {

using launch::blocks_for;

// One warp per batch row: the LocFrame (f, sgn, den) of loc[b].
template <class scalar_t>
__global__ void vmf_frame_kernel(const scalar_t* __restrict__ loc, double* __restrict__ frame, int64_t B, int64_t d) {
  const int lane = threadIdx.x & (kWarp - 1);
  for (int64_t b : launch::warp_stride(B)) {
    const scalar_t* mu = loc + b * d;
    double mm = 0.0;
    for (int64_t i = lane; i < d; i += kWarp) mm += static_cast<double>(mu[i]) * static_cast<double>(mu[i]);
    mm = warp_sum(mm);
    double scale = 1.0;
    if (vmf::loc_needs_scaling(mm)) {  // the same on every lane
      double mx = 0.0;
      for (int64_t i = lane; i < d; i += kWarp) mx = ::fmax(mx, ::fabs(static_cast<double>(mu[i])));
      for (int o = kWarp / 2; o > 0; o >>= 1) mx = ::fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      scale = vmf::loc_scale(mx);
      mm = 0.0;
      for (int64_t i = lane; i < d; i += kWarp) {
        const double m = static_cast<double>(mu[i]) * scale;
        mm += m * m;
      }
      mm = warp_sum(mm);
    }
    if (lane == 0) {
      const vmf::LocFrame t = vmf::loc_frame(mm, scale, static_cast<double>(mu[0]));
      frame[3 * b] = t.f;
      frame[3 * b + 1] = t.sgn;
      frame[3 * b + 2] = t.den;
    }
  }
}

__device__ inline vmf::LocFrame frame_at(const double* f, int64_t b) { return {f[3 * b], f[3 * b + 1], f[3 * b + 2]}; }

// One warp per sample row: (a, q) and, with the concentration's gradient, dL/dw (the
// factor dw/dkappa is applied by vmf_dwdk_kernel, one thread per row).
template <class scalar_t>
__global__ void vmf_backward_rows_kernel(const scalar_t* __restrict__ grad_x, const scalar_t* __restrict__ grad_omw,
                                         const scalar_t* __restrict__ x, const scalar_t* __restrict__ omw,
                                         const scalar_t* __restrict__ loc, const double* __restrict__ frame,
                                         double* __restrict__ rows, int64_t nrows, int64_t B, int64_t d,
                                         bool concentration_grad) {
  const int lane = threadIdx.x & (kWarp - 1);
  for (int64_t r : launch::warp_stride(nrows)) {
    const int64_t b = r % B;
    const vmf::LocFrame t = frame_at(frame, b);
    const scalar_t* mu = loc + b * d;
    const scalar_t* xr = x + r * d;
    const scalar_t* gr = grad_x + r * d;
    double mx = 0.0, mg = 0.0;
    for (int64_t i = 1 + lane; i < d; i += kWarp) {
      const double m = static_cast<double>(mu[i]) * t.f;
      mx += m * static_cast<double>(xr[i]);
      mg += m * static_cast<double>(gr[i]);
    }
    mx = warp_sum(mx);
    mg = warp_sum(mg);
    const double x0 = static_cast<double>(xr[0]), g0 = static_cast<double>(gr[0]);
    const vmf::RowBackward rb = vmf::row_backward(t, x0, g0, vmf::v_dot(t, x0, mx), vmf::v_dot(t, g0, mg));
    double dl = 0.0;
    if (concentration_grad) {
      double tang = 0.0;
      for (int64_t i = 1 + lane; i < d; i += kWarp) {
        const double m = static_cast<double>(mu[i]) * t.f;
        tang += (t.sgn * static_cast<double>(gr[i]) + m * rb.q) * (t.sgn * static_cast<double>(xr[i]) + m * rb.a);
      }
      tang = warp_sum(tang);
      dl = vmf::marginal_dl_dw(rb.gq0, tang, static_cast<double>(omw[r]),
                               grad_omw ? static_cast<double>(grad_omw[r]) : 0.0);
    }
    if (lane == 0) {
      rows[3 * r] = rb.a;
      rows[3 * r + 1] = rb.q;
      rows[3 * r + 2] = dl;
    }
  }
}

template <class G, class scalar_t>
__global__ void vmf_dwdk_kernel(const scalar_t* __restrict__ omw, const scalar_t* __restrict__ kappa,
                                double* __restrict__ rows, int64_t nrows, int64_t B, int64_t d) {
  for (int64_t r : launch::grid_stride(nrows)) {
    rows[3 * r + 2] *= G::at(static_cast<double>(omw[r]), static_cast<double>(kappa[r % B]), static_cast<double>(d));
  }
}

// The loc-gradient terms of batch row b's samples s in [s0, s1), entry i (m = mu_i f).
template <class scalar_t>
__device__ inline double loc_terms(const double* __restrict__ rows, const scalar_t* __restrict__ grad_x,
                                   const scalar_t* __restrict__ x, const vmf::LocFrame& t, double m, int64_t i,
                                   int64_t b, int64_t s0, int64_t s1, int64_t B, int64_t d) {
  double acc = 0.0;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t r = s * B + b;
    const double a = rows[3 * r], q = rows[3 * r + 1];
    const double sa = -t.sgn * a;
    const double xi = static_cast<double>(x[r * d + i]), gi = static_cast<double>(grad_x[r * d + i]);
    if (i == 0) {
      acc += sa * gi + q * (t.sgn * (xi - a * t.den)) - sa * q;
    } else {
      acc += sa * gi + q * (t.sgn * xi + m * a);
    }
  }
  return acc;
}

// Samples per chunk of the two-stage sum over samples: with more samples than this, one warp per
// (chunk, batch row) writes partial sums, and the reduce kernel adds the chunks in order (so the
// result stays deterministic).  One warp per batch row walking every sample serially left most
// of the GPU idle (64 warps for 130,000 samples a row: 62 ms for what the sampler draws in 1.4 ms).
constexpr int64_t kSampleChunk = 256;

// One warp per (chunk c, batch row b, tile of 32 entries), u = c B + b: part[u d + i] for the tile's
// entries i, and partk[u] (by tile 0).  The tiles keep the grid full when B and the chunks are few
// and d is large (64 rows of 381 samples at d = 1024: 128 warps without them, 4096 with).
template <class scalar_t>
__global__ void vmf_backward_partial_kernel(double* __restrict__ part, double* __restrict__ partk,
                                            const double* __restrict__ rows, const scalar_t* __restrict__ grad_x,
                                            const scalar_t* __restrict__ x, const scalar_t* __restrict__ loc,
                                            const double* __restrict__ frame, int64_t n, int64_t B, int64_t d,
                                            int64_t nchunk, int64_t ntile) {
  const int lane = threadIdx.x & (kWarp - 1);
  for (int64_t v : launch::warp_stride(nchunk * B * ntile)) {
    const int64_t u = v / ntile, tile = v - u * ntile;
    const int64_t c = u / B, b = u - c * B;
    const int64_t s0 = c * kSampleChunk, s1 = s0 + kSampleChunk < n ? s0 + kSampleChunk : n;
    if (partk != nullptr && tile == 0) {  // the same on every lane of the warp
      double k = 0.0;
      for (int64_t s = s0 + lane; s < s1; s += kWarp) k += rows[3 * (s * B + b) + 2];
      k = warp_sum(k);
      if (lane == 0) partk[u] = k;
    }
    if (part == nullptr) continue;
    const int64_t i = tile * kWarp + lane;
    if (i < d) {
      const vmf::LocFrame t = frame_at(frame, b);
      part[u * d + i] = loc_terms(rows, grad_x, x, t, static_cast<double>(loc[b * d + i]) * t.f, i, b, s0, s1, B, d);
    }
  }
}

// One warp per batch row: the sums over samples (directly, or over the chunks' partial sums in
// order when part / partk are given), then the projection (I - mu mu^T) f.
template <class scalar_t>
__global__ void vmf_backward_reduce_kernel(scalar_t* __restrict__ grad_loc, scalar_t* __restrict__ grad_kappa,
                                           double* __restrict__ gm, const double* __restrict__ rows,
                                           const scalar_t* __restrict__ grad_x, const scalar_t* __restrict__ x,
                                           const scalar_t* __restrict__ loc, const double* __restrict__ frame,
                                           const double* __restrict__ part, const double* __restrict__ partk,
                                           int64_t nchunk, int64_t n, int64_t B, int64_t d) {
  const int lane = threadIdx.x & (kWarp - 1);
  for (int64_t b : launch::warp_stride(B)) {
    const vmf::LocFrame t = frame_at(frame, b);
    const scalar_t* mu = loc + b * d;
    if (grad_kappa != nullptr && lane == 0) {
      double gk = 0.0;
      if (partk != nullptr) {
        for (int64_t c = 0; c < nchunk; ++c) gk += partk[c * B + b];
      } else {
        for (int64_t s = 0; s < n; ++s) gk += rows[3 * (s * B + b) + 2];
      }
      grad_kappa[b] = static_cast<scalar_t>(gk);
    }
    if (grad_loc == nullptr) continue;
    double* g = gm + b * d;
    double dot = 0.0;
    for (int64_t i = lane; i < d; i += kWarp) {
      const double m = static_cast<double>(mu[i]) * t.f;
      double acc = 0.0;
      if (part != nullptr) {
        for (int64_t c = 0; c < nchunk; ++c) acc += part[(c * B + b) * d + i];
      } else {
        acc = loc_terms(rows, grad_x, x, t, m, i, b, 0, n, B, d);
      }
      g[i] = acc;
      dot += m * acc;
    }
    dot = warp_sum(dot);
    for (int64_t i = lane; i < d; i += kWarp) {
      grad_loc[b * d + i] = static_cast<scalar_t>(t.f * (g[i] - static_cast<double>(mu[i]) * t.f * dot));
    }
  }
}

// The passes of vmf::Ops::sample_backward (host/vmf_host.h, shared with the CPU), with the
// marginal's dw/dkappa from G.
template <class G>
struct Backward {
  static void frames(at::Tensor& frame, const at::Tensor& loc) {
    const int64_t B = loc.size(0), d = loc.size(1);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      vmf_frame_kernel<scalar_t><<<blocks_for(B, kThreads / kWarp), kThreads, 0, launch::stream()>>>(
          loc.const_data_ptr<scalar_t>(), frame.mutable_data_ptr<double>(), B, d);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  static void rows(at::Tensor& rows, const at::Tensor& grad_x, const at::Tensor& grad_omw, const at::Tensor& x,
                   const at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa, const at::Tensor& frame,
                   bool concentration_grad) {
    const int64_t B = loc.size(0), d = loc.size(1), nrows = x.size(0) * B;
    const auto stream = launch::stream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      vmf_backward_rows_kernel<scalar_t><<<blocks_for(nrows, kThreads / kWarp), kThreads, 0, stream>>>(
          grad_x.const_data_ptr<scalar_t>(), grad_omw.defined() ? grad_omw.const_data_ptr<scalar_t>() : nullptr,
          x.const_data_ptr<scalar_t>(), omw.const_data_ptr<scalar_t>(), loc.const_data_ptr<scalar_t>(),
          frame.const_data_ptr<double>(), rows.mutable_data_ptr<double>(), nrows, B, d, concentration_grad);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (concentration_grad) {
        vmf_dwdk_kernel<G, scalar_t><<<blocks_for(nrows), kThreads, 0, stream>>>(
            omw.const_data_ptr<scalar_t>(), kappa.const_data_ptr<scalar_t>(), rows.mutable_data_ptr<double>(), nrows,
            B, d);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  }

  static void reduce(const at::Tensor& grad_loc, const at::Tensor& grad_kappa, const at::Tensor& rows,
                     const at::Tensor& grad_x, const at::Tensor& x, const at::Tensor& loc, const at::Tensor& frame) {
    const int64_t n = x.size(0), B = loc.size(0), d = loc.size(1);
    at::Tensor gm = grad_loc.defined() ? at::empty({B, d}, loc.options().dtype(at::kDouble)) : at::Tensor();
    const int64_t nchunk = (n + kSampleChunk - 1) / kSampleChunk;
    // the two-stage sum, with more than one chunk of samples or more than a warp's width of entries
    at::Tensor part, partk;
    if ((nchunk > 1 || (grad_loc.defined() && d > kWarp)) && B > 0) {
      if (grad_loc.defined() && d > 0) part = at::empty({nchunk * B * d}, loc.options().dtype(at::kDouble));
      if (grad_kappa.defined()) partk = at::empty({nchunk * B}, loc.options().dtype(at::kDouble));
    }
    const auto stream = launch::stream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      if (part.defined() || partk.defined()) {
        const int64_t ntile = part.defined() ? (d + kWarp - 1) / kWarp : 1;
        const int64_t nwarps = nchunk * B * ntile;
        vmf_backward_partial_kernel<scalar_t><<<blocks_for(nwarps, kThreads / kWarp), kThreads, 0, stream>>>(
            part.defined() ? part.mutable_data_ptr<double>() : nullptr,
            partk.defined() ? partk.mutable_data_ptr<double>() : nullptr, rows.const_data_ptr<double>(),
            grad_x.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), loc.const_data_ptr<scalar_t>(),
            frame.const_data_ptr<double>(), n, B, d, nchunk, ntile);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      vmf_backward_reduce_kernel<scalar_t><<<blocks_for(B, kThreads / kWarp), kThreads, 0, stream>>>(
          grad_loc.defined() ? grad_loc.mutable_data_ptr<scalar_t>() : nullptr,
          grad_kappa.defined() ? grad_kappa.mutable_data_ptr<scalar_t>() : nullptr,
          gm.defined() ? gm.mutable_data_ptr<double>() : nullptr, rows.const_data_ptr<double>(),
          grad_x.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), loc.const_data_ptr<scalar_t>(),
          frame.const_data_ptr<double>(), part.defined() ? part.const_data_ptr<double>() : nullptr,
          partk.defined() ? partk.const_data_ptr<double>() : nullptr, nchunk, n, B, d);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
};

}  // namespace sphere
}  // namespace vmfdist
