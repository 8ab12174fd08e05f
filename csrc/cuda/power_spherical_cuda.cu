// CUDA kernel of the power spherical sampler over the host-device math of
// vmfdist/power_spherical.h (the marginal) and vmfdist/vmf.h (the reflection), the same code
// the CPU loop in csrc/cpu/power_spherical_cpu.cpp calls.
//
// One warp per sample row, as the vMF sampler (vmf_cuda.cu): the lanes share the row's
// tangent normals (lane l takes Philox blocks l, l+32, ... of the row's tangent stream,
// exactly the blocks the CPU loop takes for those entries), reduce |e|^2, mu.e and |mu|^2
// with shuffles, lane 0 draws the marginal (two Gamma variates), and each lane then rotates
// the entries it wrote.  Rows therefore match the CPU up to the last bit of the
// transcendental functions.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <type_traits>

#include "vmfdist/fast_normal.h"
#include "vmfdist/power_spherical.h"
#include "vmfdist/vmf.h"
#include "host/power_spherical_host.h"
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
__global__ void power_spherical_sample_kernel(const scalar_t* __restrict__ loc, const scalar_t* __restrict__ kappa,
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
      const vmf::Marginal m = power_spherical::sample_marginal(seed, offset, static_cast<uint64_t>(row),
                                                               static_cast<double>(d), static_cast<double>(kappa[b]));
      w = m.w;
      omw = m.omw;
      opw = m.opw;
    }
    w = __shfl_sync(0xffffffffu, w, 0);
    omw = __shfl_sync(0xffffffffu, omw, 0);
    opw = __shfl_sync(0xffffffffu, opw, 0);
    const vmf::RowRotation t = vmf::row_rotation(w, omw, opw, ee, me, mm, static_cast<double>(mu[0]) * mu_scale);
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

// The kernel launch of power_spherical::Ops (host/power_spherical_host.h, shared with the CPU).
struct CudaPowerSpherical : CudaSeeds {
  static void sample(at::Tensor& x, at::Tensor& omw, const at::Tensor& loc, const at::Tensor& kappa,
                     const int64_t* seed_offset) {
    const int64_t B = loc.size(0), d = loc.size(1), rows = x.size(0) * B;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "power_spherical_sample", [&] {
      power_spherical_sample_kernel<scalar_t><<<blocks_for(rows, kThreads / kWarp), kThreads, 0, launch::stream()>>>(
          loc.const_data_ptr<scalar_t>(), kappa.const_data_ptr<scalar_t>(), x.mutable_data_ptr<scalar_t>(),
          omw.mutable_data_ptr<scalar_t>(), rows, B, d, seed_offset);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("power_spherical_sample", &power_spherical::Ops<CudaPowerSpherical>::sample);
}

}  // namespace vmfdist
