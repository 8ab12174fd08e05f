// CUDA kernels of the fused radial noise (math and stream layout: vmfdist/radial.h),
// the same passes as csrc/cpu/radial_cpu.cpp: (1) one thread block per chunk writes
// the normals into the output and reduces their squares; (2) one thread per group
// adds the chunk sums in order and draws the radius; (3) an elementwise pass forms
// loc + scale * eps * coef in place (the eps copied to `noise` first when the caller keeps
// them).  The scale gradient reads the kept eps or regenerates them per element.
// radial_sample runs passes (1) and (2), then (3) with softplus(rho) for the scale, and its KL as
// one thread per element writing its term (radial::kl_term) and a sum of the terms on the device;
// its backward is one thread per element over the samples, as the scale gradient.
// The operators (checks, seed, outputs) are shared with the CPU: radial::Ops in host/radial_host.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "vmfdist/radial.h"
#include "host/radial_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using radial::kRadialChunk;
using radial::RadialLayout;
using launch::blocks_for;
using launch::kThreads;

template <class scalar_t>
__global__ void radial_pass1(scalar_t* __restrict__ out, double* __restrict__ partial, int64_t units,
                             int64_t nchunk, int64_t length, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  for (int64_t u : launch::block_stride(units)) {
    const int64_t t = u / nchunk, c = u % nchunk;
    const int64_t start = c * kRadialChunk;
    const int64_t n = min(kRadialChunk, length - start);
    scalar_t* dst = out + t * length + start;
    double acc = 0.0;
    for (int64_t q = threadIdx.x; 4 * q < n; q += blockDim.x) {
      double z[4];
      fast_normal::normal4_for<scalar_t>(seed, offset, static_cast<uint64_t>(t), static_cast<uint32_t>((start >> 2) + q), z);
      for (int k = 0; k < 4; ++k) {
        const int64_t i = 4 * q + k;
        if (i < n) {
          const scalar_t e = static_cast<scalar_t>(z[k]);
          dst[i] = e;
          const double ed = static_cast<double>(e);
          acc += ed * ed;
        }
      }
    }
    const double sum = launch::block_sum(acc);
    if (threadIdx.x == 0) partial[u] = sum;
  }
}

__global__ void radial_coef(const double* __restrict__ partial, double* __restrict__ coef, int64_t streams,
                            int64_t nchunk, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  for (int64_t t : launch::grid_stride(streams)) {
    double ss = 0.0;
    for (int64_t c = 0; c < nchunk; ++c) ss += partial[t * nchunk + c];
    coef[t] = radial::group_coef(seed, offset, static_cast<uint64_t>(t), ss);
  }
}

template <class scalar_t>
__global__ void radial_pass2(scalar_t* __restrict__ out, const scalar_t* __restrict__ loc,
                             const scalar_t* __restrict__ scale, const double* __restrict__ coef, int64_t total,
                             int64_t length, int64_t event) {
  for (int64_t i : launch::grid_stride(total)) {
    const int64_t j = i % event;  // position in the event
    const int64_t t = i / length;  // stream index s * groups + g
    out[i] = static_cast<scalar_t>(static_cast<double>(loc[j]) +
                                   static_cast<double>(scale[j]) * (static_cast<double>(out[i]) * coef[t]));
  }
}

template <class scalar_t>
__global__ void radial_scale_grad_kernel(const scalar_t* __restrict__ grad, const double* __restrict__ coef,
                                         const scalar_t* __restrict__ noise, scalar_t* __restrict__ out, int64_t S,
                                         int64_t groups, int64_t length, const int64_t* __restrict__ seed_offset) {
  const SeedOffset so = load_seed_offset(seed_offset);
  const uint64_t seed = so.seed, offset = so.offset;
  const int64_t event = groups * length;
  for (int64_t j : launch::grid_stride(event)) {
    const int64_t g = j / length, k = j % length;
    double acc = 0.0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t = s * groups + g;
      double e;
      if (noise != nullptr) {  // kept by the forward pass
        e = static_cast<double>(noise[s * event + j]);
      } else {
        double z[4];
        fast_normal::normal4_for<scalar_t>(seed, offset, static_cast<uint64_t>(t), static_cast<uint32_t>(k >> 2), z);
        e = static_cast<double>(static_cast<scalar_t>(z[k & 3]));
      }
      acc += static_cast<double>(grad[s * event + j]) * (e * coef[t]);
    }
    out[j] = static_cast<scalar_t>(acc);
  }
}


// The prior of element j (per-element loc / scale where the prior has them).
template <class scalar_t, class T>
__device__ radial::KlPrior<T> kl_prior_at(const scalar_t* m, const scalar_t* s, bool m_full, bool s_full, int64_t j,
                                          T sqrt_d, T c1) {
  return radial::kl_prior_of<T>(static_cast<T>(m[m_full ? j : 0]), static_cast<T>(s[s_full ? j : 0]), sqrt_d, c1);
}

// out[s, j] = loc[j] + softplus(rho[j]) * eps * coef[s] in place (in double, rounded once).
template <class scalar_t>
__global__ void radial_sample_pass2(scalar_t* __restrict__ out, const scalar_t* __restrict__ loc,
                                    const scalar_t* __restrict__ rho, const double* __restrict__ coef, int64_t total,
                                    int64_t D) {
  using T = at::opmath_type<scalar_t>;
  for (int64_t i : launch::grid_stride(total)) {
    const int64_t j = i % D;
    const T sigma = meanfield::softplus<T>(static_cast<T>(rho[j]));
    out[i] = static_cast<scalar_t>(static_cast<double>(loc[j]) +
                                   static_cast<double>(sigma) * (static_cast<double>(out[i]) * coef[i / D]));
  }
}

template <class scalar_t>
__global__ void radial_kl_terms(double* __restrict__ terms, const scalar_t* __restrict__ loc,
                                const scalar_t* __restrict__ rho, const scalar_t* __restrict__ m,
                                const scalar_t* __restrict__ s, bool m_full, bool s_full, int64_t D) {
  using T = at::opmath_type<scalar_t>;
  const T sqrt_d = static_cast<T>(::sqrt(static_cast<double>(D))), c1 = static_cast<T>(1.0 - 1.0 / D);
  for (int64_t j : launch::grid_stride(D)) {
    const T r = static_cast<T>(rho[j]);
    terms[j] = static_cast<double>(radial::kl_term<T>(static_cast<T>(loc[j]), r, meanfield::scale_of<T>(r),
                                                      kl_prior_at<scalar_t, T>(m, s, m_full, s_full, j, sqrt_d, c1)));
  }
}

template <class scalar_t>
__global__ void radial_sample_backward_kernel(scalar_t* __restrict__ g_loc, scalar_t* __restrict__ g_rho,
                                              const scalar_t* __restrict__ grad, const double* __restrict__ coef,
                                              const scalar_t* __restrict__ noise, const scalar_t* __restrict__ loc,
                                              const scalar_t* __restrict__ rho, const scalar_t* __restrict__ m,
                                              const scalar_t* __restrict__ s, bool m_full, bool s_full,
                                              const double* __restrict__ grad_kl, int64_t S, int64_t D,
                                              const int64_t* __restrict__ seed_offset) {
  using T = at::opmath_type<scalar_t>;
  const SeedOffset so = load_seed_offset(seed_offset);
  const T sqrt_d = static_cast<T>(::sqrt(static_cast<double>(D))), c1 = static_cast<T>(1.0 - 1.0 / D);
  for (int64_t j : launch::grid_stride(D)) {
    double ge = 0.0, gs = 0.0;
    for (int64_t k = 0; k < S; ++k) {
      double e;
      if (noise != nullptr) {
        e = static_cast<double>(noise[k * D + j]);
      } else {
        double z[4];
        fast_normal::normal4_for<scalar_t>(so.seed, so.offset, static_cast<uint64_t>(k), static_cast<uint32_t>(j >> 2),
                                           z);
        e = static_cast<double>(static_cast<scalar_t>(z[j & 3]));
      }
      const double g = static_cast<double>(grad[k * D + j]);
      ge += g * (e * coef[k]);
      gs += g;
    }
    const T r = static_cast<T>(rho[j]);
    const meanfield::Scale<T> q = meanfield::scale_of<T>(r);
    T a = T(0), b = T(0);
    if (grad_kl != nullptr) {
      radial::kl_grads<T>(static_cast<T>(*grad_kl), static_cast<T>(loc[j]), r, q,
                          kl_prior_at<scalar_t, T>(m, s, m_full, s_full, j, sqrt_d, c1), &a, &b);
    }
    g_rho[j] = static_cast<scalar_t>(static_cast<double>(q.sigmoid) * ge + static_cast<double>(b));
    if (g_loc != nullptr) g_loc[j] = static_cast<scalar_t>(gs + static_cast<double>(a));
  }
}

// Passes (1) and (2) for `streams` groups of `length` elements: the normals into out (copied
// into noise when it is not empty) and coef = r / |eps| per group.
template <class scalar_t>
void draw_eps(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, int64_t streams, int64_t length,
              const int64_t* pso) {
  const int64_t nchunk = (length + kRadialChunk - 1) / kRadialChunk;
  const int64_t units = streams * nchunk;
  at::Tensor partial = at::empty({units}, out.options().dtype(at::kDouble));
  const auto stream = launch::stream();
  radial_pass1<scalar_t><<<blocks_for(units, 1), kThreads, 0, stream>>>(
      out.mutable_data_ptr<scalar_t>(), partial.mutable_data_ptr<double>(), units, nchunk, length, pso);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (noise.numel() > 0) noise.copy_(out);  // the eps, kept for the backward (same stream)
  radial_coef<<<blocks_for(streams), kThreads, 0, stream>>>(partial.const_data_ptr<double>(),
                                                            coef.mutable_data_ptr<double>(), streams, nchunk, pso);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

struct CudaRadial : CudaSeeds {
  static void noise(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, const at::Tensor& loc,
                    const at::Tensor& scale, const RadialLayout& lay, const int64_t* pso) {
    const int64_t streams = out.size(0) * lay.groups;
    const int64_t event = lay.groups * lay.length;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "radial_noise", [&] {
      draw_eps<scalar_t>(out, coef, noise, streams, lay.length, pso);
      radial_pass2<scalar_t><<<blocks_for(streams * lay.length), kThreads, 0, launch::stream()>>>(
          out.mutable_data_ptr<scalar_t>(), loc.const_data_ptr<scalar_t>(), scale.const_data_ptr<scalar_t>(),
          coef.const_data_ptr<double>(), streams * lay.length, lay.length, event);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }

  static void scale_grad(at::Tensor& out, const at::Tensor& grad, const at::Tensor& coef, const at::Tensor& noise,
                         const RadialLayout& lay, const int64_t* pso) {
    const int64_t event = lay.groups * lay.length;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "radial_noise_scale_grad", [&] {
      radial_scale_grad_kernel<scalar_t><<<blocks_for(event), kThreads, 0, launch::stream()>>>(
          grad.const_data_ptr<scalar_t>(), coef.const_data_ptr<double>(),
          noise.defined() ? noise.const_data_ptr<scalar_t>() : nullptr, out.mutable_data_ptr<scalar_t>(),
          grad.size(0), lay.groups, lay.length, pso);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  static void sample(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, at::Tensor& kl,
                     const meanfield::Operands& x, double kl_offset, const int64_t* pso) {
    const int64_t S = out.size(0), D = x.rho.numel();
    const auto stream = launch::stream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "radial_sample", [&] {
      if (S > 0) {
        draw_eps<scalar_t>(out, coef, noise, S, D, pso);
        radial_sample_pass2<scalar_t><<<blocks_for(S * D), kThreads, 0, stream>>>(
            out.mutable_data_ptr<scalar_t>(), x.loc.const_data_ptr<scalar_t>(), x.rho.const_data_ptr<scalar_t>(),
            coef.const_data_ptr<double>(), S * D, D);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      if (x.with_kl()) {
        at::Tensor terms = at::empty({D}, x.rho.options().dtype(at::kDouble));
        radial_kl_terms<scalar_t><<<blocks_for(D), kThreads, 0, stream>>>(
            terms.mutable_data_ptr<double>(), x.loc.const_data_ptr<scalar_t>(), x.rho.const_data_ptr<scalar_t>(),
            x.prior_loc.const_data_ptr<scalar_t>(), x.prior_scale.const_data_ptr<scalar_t>(),
            x.prior_loc.numel() != 1, x.prior_scale.numel() != 1, D);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        kl.copy_(terms.sum() + kl_offset);
      }
    });
  }

  static void sample_backward(at::Tensor& g_loc, at::Tensor& g_rho, const at::Tensor& grad, const at::Tensor& coef,
                              const at::Tensor& noise, const meanfield::Operands& x, const at::Tensor& grad_kl,
                              const int64_t* pso) {
    const int64_t S = grad.size(0), D = x.rho.numel();
    const bool with_kl = x.with_kl();
    const at::Tensor gkl = with_kl ? grad_kl.reshape({}).to(at::kDouble) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "radial_sample_backward", [&] {
      radial_sample_backward_kernel<scalar_t><<<blocks_for(D), kThreads, 0, launch::stream()>>>(
          g_loc.numel() > 0 ? g_loc.mutable_data_ptr<scalar_t>() : nullptr, g_rho.mutable_data_ptr<scalar_t>(),
          grad.const_data_ptr<scalar_t>(), coef.const_data_ptr<double>(),
          noise.defined() ? noise.const_data_ptr<scalar_t>() : nullptr, x.loc.const_data_ptr<scalar_t>(),
          x.rho.const_data_ptr<scalar_t>(), with_kl ? x.prior_loc.const_data_ptr<scalar_t>() : nullptr,
          with_kl ? x.prior_scale.const_data_ptr<scalar_t>() : nullptr, with_kl && x.prior_loc.numel() != 1,
          with_kl && x.prior_scale.numel() != 1, with_kl ? gkl.const_data_ptr<double>() : nullptr, S, D, pso);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("radial_noise", &radial::Ops<CudaRadial>::noise);
  m.impl("radial_noise_scale_grad", &radial::Ops<CudaRadial>::scale_grad);
  m.impl("radial_sample", &radial::Ops<CudaRadial>::sample);
  m.impl("radial_sample_backward", &radial::Ops<CudaRadial>::sample_backward);
}

}  // namespace vmfdist
