// CUDA kernels of the mean-field ops (math and noise layout: vmfdist/meanfield.h), the same
// computations as csrc/cpu/meanfield_cpu.cpp:
//   * sampling: one thread per block of four normals (one Philox block) of one sample;
//   * the KL: one thread block per chunk of kChunk elements sums its terms in double, then one
//     block adds the chunk sums in a fixed order (deterministic, independent of the launch; the
//     CPU adds the same chunk sums in order: equal to rounding);
//   * gradients: one thread per block of four elements, looping over the samples (the normals
//     read back when kept, else regenerated); the KL's gradient factor is read on the device.
// The operators (checks, seed, outputs) are shared with the CPU: meanfield::Ops in
// host/meanfield_host.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "vmfdist/meanfield.h"
#include "host/meanfield_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using launch::blocks_for;
using launch::kThreads;
using meanfield::kChunk;
using meanfield::Operands;

// The prior of element i: strides 0 (one element) or 1 (rho's shape); null for none.
template <typename scalar_t, typename T>
struct PriorRef {
  const scalar_t *m, *s;
  int64_t m_stride, s_stride;
  __device__ meanfield::Prior<T> at(int64_t i) const {
    return meanfield::prior_of<T>(static_cast<T>(m[i * m_stride]), static_cast<T>(s[i * s_stride]));
  }
};

template <typename scalar_t, typename T>
PriorRef<scalar_t, T> prior_ref(const at::Tensor& pm, const at::Tensor& ps) {
  if (!pm.defined()) return {nullptr, nullptr, 0, 0};
  return {pm.const_data_ptr<scalar_t>(), ps.const_data_ptr<scalar_t>(), pm.numel() == 1 ? 0 : 1,
          ps.numel() == 1 ? 0 : 1};
}

// out[s] = loc + softplus(rho) eps_s; eps kept in noise when not null.
template <typename scalar_t>
__global__ void sample_kernel(scalar_t* __restrict__ out, at::opmath_type<scalar_t>* __restrict__ noise,
                              const scalar_t* __restrict__ loc, const scalar_t* __restrict__ rho, int64_t S,
                              int64_t D, const int64_t* __restrict__ seed_offset) {
  using T = at::opmath_type<scalar_t>;
  const SeedOffset so = load_seed_offset(seed_offset);
  const int64_t nq = (D + 3) / 4;
  for (int64_t idx : launch::grid_stride(S * nq)) {
    const int64_t s = idx / nq, q = idx - s * nq;
    double z[4];
    fast_normal::normal4_for<scalar_t>(so.seed, so.offset, static_cast<uint64_t>(s), static_cast<uint32_t>(q), z);
    for (int k = 0; k < 4; ++k) {
      const int64_t j = 4 * q + k;
      if (j < D) {
        const T eps = static_cast<T>(z[k]);
        const T sigma = meanfield::softplus<T>(static_cast<T>(rho[j]));
        out[s * D + j] = static_cast<scalar_t>(loc != nullptr ? static_cast<T>(loc[j]) + sigma * eps : sigma * eps);
        if (noise != nullptr) noise[s * D + j] = eps;
      }
    }
  }
}

// partial[c] = sum of the KL terms of chunk c (in double; one thread block per chunk).
template <typename scalar_t>
__global__ void kl_partial_kernel(double* __restrict__ partial, const scalar_t* __restrict__ mu,
                                  const scalar_t* __restrict__ rho, PriorRef<scalar_t, at::opmath_type<scalar_t>> p,
                                  int64_t D, int64_t nchunk) {
  using T = at::opmath_type<scalar_t>;
  for (int64_t c : launch::block_stride(nchunk)) {
    const int64_t start = c * kChunk;
    const int64_t n = min(kChunk, D - start);
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const int64_t j = start + i;
      acc += static_cast<double>(meanfield::kl_term<T>(static_cast<T>(mu[j]), static_cast<T>(rho[j]), p.at(j)));
    }
    const double sum = launch::block_sum(acc);
    if (threadIdx.x == 0) partial[c] = sum;
  }
}

// kl = the chunk sums added by one block: thread t adds chunks t, t + kThreads, ... in order, then
// the block's fixed tree (deterministic).  One thread adding them all was latency-bound: 0.83 ms
// for the 4224 chunks of 4e6 elements on an H200, 5x the partial sums themselves (Nsight Compute).
template <typename scalar_t>
__global__ void kl_total_kernel(scalar_t* __restrict__ kl, const double* __restrict__ partial, int64_t nchunk) {
  double acc = 0.0;
  for (int64_t c = threadIdx.x; c < nchunk; c += blockDim.x) acc += partial[c];
  const double total = launch::block_sum(acc);
  if (threadIdx.x == 0) kl[0] = static_cast<scalar_t>(total);
}

// The summed KL into the 0-dim tensor `kl` (rho not empty).
void launch_kl(at::Tensor& kl, const Operands& x) {
  const int64_t D = x.rho.numel();
  const int64_t nchunk = (D + kChunk - 1) / kChunk;
  at::Tensor partial = at::empty({nchunk}, x.rho.options().dtype(at::kDouble));
  const auto stream = launch::stream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_kl", [&] {
    using T = at::opmath_type<scalar_t>;
    kl_partial_kernel<scalar_t><<<blocks_for(nchunk, 1), kThreads, 0, stream>>>(
        partial.mutable_data_ptr<double>(), x.loc.const_data_ptr<scalar_t>(), x.rho.const_data_ptr<scalar_t>(),
        prior_ref<scalar_t, T>(x.prior_loc, x.prior_scale), D, nchunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    kl_total_kernel<scalar_t><<<1, kThreads, 0, stream>>>(kl.mutable_data_ptr<scalar_t>(),
                                                          partial.const_data_ptr<double>(), nchunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// grad_rho = sigmoid(rho) sum_s g_s eps_s (+ g_kl dKL/drho), grad_loc = sum_s g_s (+ g_kl dKL/dmu)
// when g_loc is not null; g_kl (a double on the device) is null without the KL.
template <typename scalar_t>
__global__ void backward_kernel(scalar_t* __restrict__ g_loc, scalar_t* __restrict__ g_rho,
                                const scalar_t* __restrict__ grad, const at::opmath_type<scalar_t>* __restrict__ noise,
                                const scalar_t* __restrict__ mu, const scalar_t* __restrict__ rho,
                                PriorRef<scalar_t, at::opmath_type<scalar_t>> p, const double* __restrict__ g_kl,
                                int64_t S, int64_t D, const int64_t* __restrict__ seed_offset) {
  using T = at::opmath_type<scalar_t>;
  const SeedOffset so = load_seed_offset(seed_offset);
  const int64_t nq = (D + 3) / 4;
  for (int64_t q : launch::grid_stride(nq)) {
    T acc_ge[4] = {T(0), T(0), T(0), T(0)}, acc_g[4] = {T(0), T(0), T(0), T(0)};
    for (int64_t s = 0; s < S; ++s) {
      double z[4];
      if (noise == nullptr) {
        fast_normal::normal4_for<scalar_t>(so.seed, so.offset, static_cast<uint64_t>(s), static_cast<uint32_t>(q), z);
      }
      for (int k = 0; k < 4; ++k) {
        const int64_t j = 4 * q + k;
        if (j < D) {
          const T eps = noise != nullptr ? noise[s * D + j] : static_cast<T>(z[k]);
          const T g = static_cast<T>(grad[s * D + j]);
          acc_ge[k] += g * eps;
          acc_g[k] += g;
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      const int64_t j = 4 * q + k;
      if (j >= D) break;
      const T r = static_cast<T>(rho[j]);
      if (g_kl != nullptr) {
        const meanfield::Scale<T> sc = meanfield::scale_of<T>(r);
        T a, b;
        meanfield::kl_grads<T>(static_cast<T>(*g_kl), static_cast<T>(mu[j]), r, sc, p.at(j), &a, &b);
        g_rho[j] = static_cast<scalar_t>(sc.sigmoid * acc_ge[k] + b);
        if (g_loc != nullptr) g_loc[j] = static_cast<scalar_t>(acc_g[k] + a);
      } else {
        g_rho[j] = static_cast<scalar_t>(meanfield::sigmoid<T>(r) * acc_ge[k]);
        if (g_loc != nullptr) g_loc[j] = static_cast<scalar_t>(acc_g[k]);
      }
    }
  }
}

// g times the KL's derivatives (g a double on the device).
template <typename scalar_t>
__global__ void kl_backward_kernel(scalar_t* __restrict__ g_mu, scalar_t* __restrict__ g_rho,
                                   const scalar_t* __restrict__ mu, const scalar_t* __restrict__ rho,
                                   PriorRef<scalar_t, at::opmath_type<scalar_t>> p, const double* __restrict__ g,
                                   int64_t D) {
  using T = at::opmath_type<scalar_t>;
  for (int64_t j : launch::grid_stride(D)) {
    T a, b;
    meanfield::kl_grads<T>(static_cast<T>(*g), static_cast<T>(mu[j]), static_cast<T>(rho[j]), p.at(j), &a, &b);
    g_mu[j] = static_cast<scalar_t>(a);
    g_rho[j] = static_cast<scalar_t>(b);
  }
}

struct CudaMeanfield : CudaSeeds {
  static void sample(at::Tensor& out, at::Tensor& noise, at::Tensor& kl, const Operands& x, const int64_t* pso) {
    const int64_t S = out.size(0), D = x.rho.numel();
    if (S > 0) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_sample", [&] {
        using T = at::opmath_type<scalar_t>;
        sample_kernel<scalar_t><<<blocks_for(S * ((D + 3) / 4)), kThreads, 0, launch::stream()>>>(
            out.mutable_data_ptr<scalar_t>(), noise.numel() > 0 ? noise.mutable_data_ptr<T>() : nullptr,
            x.loc.defined() ? x.loc.const_data_ptr<scalar_t>() : nullptr, x.rho.const_data_ptr<scalar_t>(), S, D,
            pso);
      });
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (x.with_kl()) launch_kl(kl, x);
  }

  static void sample_backward(at::Tensor& g_loc, at::Tensor& g_rho, const at::Tensor& grad, const at::Tensor& noise,
                              const Operands& x, const at::Tensor& grad_kl, const int64_t* pso) {
    const int64_t S = grad.size(0), D = x.rho.numel();
    const at::Tensor gkl = x.with_kl() ? grad_kl.reshape({}).to(at::kDouble) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_sample_backward", [&] {
      using T = at::opmath_type<scalar_t>;
      backward_kernel<scalar_t><<<blocks_for((D + 3) / 4), kThreads, 0, launch::stream()>>>(
          g_loc.numel() > 0 ? g_loc.mutable_data_ptr<scalar_t>() : nullptr, g_rho.mutable_data_ptr<scalar_t>(),
          grad.const_data_ptr<scalar_t>(), noise.defined() ? noise.const_data_ptr<T>() : nullptr,
          x.with_kl() ? x.loc.const_data_ptr<scalar_t>() : nullptr, x.rho.const_data_ptr<scalar_t>(),
          prior_ref<scalar_t, T>(x.prior_loc, x.prior_scale), x.with_kl() ? gkl.const_data_ptr<double>() : nullptr,
          S, D, pso);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  static void kl(at::Tensor& kl, const Operands& x) { launch_kl(kl, x); }

  static void kl_backward(at::Tensor& g_loc, at::Tensor& g_rho, const at::Tensor& grad, const Operands& x) {
    const at::Tensor g = grad.reshape({}).to(at::kDouble);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.rho.scalar_type(), "meanfield_kl_backward", [&] {
      using T = at::opmath_type<scalar_t>;
      kl_backward_kernel<scalar_t><<<blocks_for(x.rho.numel()), kThreads, 0, launch::stream()>>>(
          g_loc.mutable_data_ptr<scalar_t>(), g_rho.mutable_data_ptr<scalar_t>(), x.loc.const_data_ptr<scalar_t>(),
          x.rho.const_data_ptr<scalar_t>(), prior_ref<scalar_t, T>(x.prior_loc, x.prior_scale),
          g.const_data_ptr<double>(), x.rho.numel());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("meanfield_sample", &meanfield::Ops<CudaMeanfield>::sample);
  m.impl("meanfield_sample_backward", &meanfield::Ops<CudaMeanfield>::sample_backward);
  m.impl("meanfield_kl", &meanfield::Ops<CudaMeanfield>::kl);
  m.impl("meanfield_kl_backward", &meanfield::Ops<CudaMeanfield>::kl_backward);
}

}  // namespace vmfdist
