// CUDA kernels for the von Mises-Fisher ops over the host-device math of
// vmfdist/vmf.h (the same code the CPU loops in csrc/cpu/vmf_cpu.cpp call).
//
// vmf_sample: one warp per sample row.  The lanes share the row's tangent
// normals (lane l takes Philox blocks l, l+32, ... of the row's tangent stream,
// exactly the blocks the CPU loop takes for those entries), reduce |e|^2,
// mu.e and |mu|^2 with shuffles, lane 0 draws the marginal, and each lane then
// rotates the entries it wrote.  Rows therefore match the CPU up to the last
// bit of the transcendental functions.
//
// vmf_sample_backward: a warp per batch row for loc's frame, a warp per sample row for
// its coefficients, a thread per sample row for dw/dkappa (the quadrature), and a warp
// per batch row for the sums over samples (in order, so the result is deterministic).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include <type_traits>

#include "vmfdist/fast_normal.h"
#include "vmfdist/vmf.h"
#include "host/vmf_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using launch::blocks_for;
using launch::kThreads;
using launch::kWarp;

__device__ inline double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class scalar_t>
__global__ void vmf_sample_kernel(const scalar_t* __restrict__ loc, const scalar_t* __restrict__ kappa,
                                  scalar_t* __restrict__ x, scalar_t* __restrict__ omw_out, int64_t rows,
                                  int64_t B, int64_t d, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t nt = d - 1;
  const int64_t nblk = (nt + 3) / 4;
  for (int64_t row : launch::warp_stride(rows)) {
    const int64_t b = row % B;
    const scalar_t* mu = loc + b * d;
    scalar_t* xr = x + row * d;
    double ee = 0.0, me = 0.0, mm = 0.0;
    for (int64_t j = lane; j < nblk; j += kWarp) {
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
    double w = 0.0, omw = 0.0, opw = 0.0;
    if (lane == 0) {
      const vmf::Marginal m =
          vmf::sample_marginal(seed, offset, static_cast<uint64_t>(row), static_cast<double>(d),
                               static_cast<double>(kappa[b]));
      w = m.w;
      omw = m.omw;
      opw = m.opw;
    }
    w = __shfl_sync(0xffffffffu, w, 0);
    omw = __shfl_sync(0xffffffffu, omw, 0);
    opw = __shfl_sync(0xffffffffu, opw, 0);
    // mm and me are sums over mu_i mu_scale: the reflection sees mu_0 mu_scale too
    const vmf::RowRotation t =
        vmf::row_rotation(w, omw, opw, ee, me, mm, static_cast<double>(mu[0]) * mu_scale);
    const double c = t.c, sy = t.sy;
    for (int64_t j = lane; j < nblk; j += kWarp) {
      for (int k = 0; k < 4; ++k) {
        const int64_t idx = 4 * j + k;
        if (idx < nt) {
          xr[1 + idx] = static_cast<scalar_t>(sy * static_cast<double>(xr[1 + idx]) +
                                              (static_cast<double>(mu[1 + idx]) * mu_scale) * c);
        }
      }
    }
    if (lane == 0) {
      xr[0] = static_cast<scalar_t>(t.x0);
      omw_out[row] = static_cast<scalar_t>(omw);
    }
  }
}

// ---- vmf_sample_backward (vmf.h: the backward of vmf_sample) ----

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

template <class scalar_t>
__global__ void vmf_dwdk_kernel(const scalar_t* __restrict__ omw, const scalar_t* __restrict__ kappa,
                                double* __restrict__ rows, int64_t nrows, int64_t B, int64_t d) {
  for (int64_t r : launch::grid_stride(nrows)) {
    rows[3 * r + 2] *= vmf::dw_dkappa(static_cast<double>(omw[r]), static_cast<double>(kappa[r % B]),
                                      static_cast<double>(d));
  }
}

// One warp per batch row: the sums over samples, then the projection (I - mu mu^T) f.
template <class scalar_t>
__global__ void vmf_backward_reduce_kernel(scalar_t* __restrict__ grad_loc, scalar_t* __restrict__ grad_kappa,
                                           double* __restrict__ gm, const double* __restrict__ rows,
                                           const scalar_t* __restrict__ grad_x, const scalar_t* __restrict__ x,
                                           const scalar_t* __restrict__ loc, const double* __restrict__ frame,
                                           int64_t n, int64_t B, int64_t d) {
  const int lane = threadIdx.x & (kWarp - 1);
  for (int64_t b : launch::warp_stride(B)) {
    const vmf::LocFrame t = frame_at(frame, b);
    const scalar_t* mu = loc + b * d;
    if (grad_kappa != nullptr && lane == 0) {
      double gk = 0.0;
      for (int64_t s = 0; s < n; ++s) gk += rows[3 * (s * B + b) + 2];
      grad_kappa[b] = static_cast<scalar_t>(gk);
    }
    if (grad_loc == nullptr) continue;
    double* g = gm + b * d;
    double dot = 0.0;
    for (int64_t i = lane; i < d; i += kWarp) {
      const double m = static_cast<double>(mu[i]) * t.f;
      double acc = 0.0;
      for (int64_t s = 0; s < n; ++s) {
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
      g[i] = acc;
      dot += m * acc;
    }
    dot = warp_sum(dot);
    for (int64_t i = lane; i < d; i += kWarp) {
      grad_loc[b * d + i] = static_cast<scalar_t>(t.f * (g[i] - static_cast<double>(mu[i]) * t.f * dot));
    }
  }
}

// The passes of vmf::Ops::sample_backward (host/vmf_host.h, shared with the CPU).
struct CudaVmfBackward {
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
        vmf_dwdk_kernel<scalar_t><<<blocks_for(nrows), kThreads, 0, stream>>>(
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
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample_backward", [&] {
      vmf_backward_reduce_kernel<scalar_t><<<blocks_for(B, kThreads / kWarp), kThreads, 0, launch::stream()>>>(
          grad_loc.defined() ? grad_loc.mutable_data_ptr<scalar_t>() : nullptr,
          grad_kappa.defined() ? grad_kappa.mutable_data_ptr<scalar_t>() : nullptr,
          gm.defined() ? gm.mutable_data_ptr<double>() : nullptr, rows.const_data_ptr<double>(),
          grad_x.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), loc.const_data_ptr<scalar_t>(),
          frame.const_data_ptr<double>(), n, B, d);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

// The kernel launch of vmf::Ops (host/vmf_host.h, shared with the CPU).
struct CudaVmf : CudaSeeds, CudaVmfBackward {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const int64_t* seed_offset) {
    const int64_t B = loc.size(0), d = loc.size(1), rows = x.size(0) * B;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "vmf_sample", [&] {
      vmf_sample_kernel<scalar_t><<<blocks_for(rows, kThreads / kWarp), kThreads, 0,
                                    launch::stream()>>>(
          loc.const_data_ptr<scalar_t>(), kappa.const_data_ptr<scalar_t>(), x.mutable_data_ptr<scalar_t>(),
          omw.mutable_data_ptr<scalar_t>(), rows, B, d, seed_offset);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("vmf_sample", &vmf::Ops<CudaVmf>::sample);
  m.impl("vmf_sample_backward", &vmf::Ops<CudaVmf>::sample_backward);
}

}  // namespace vmfdist
