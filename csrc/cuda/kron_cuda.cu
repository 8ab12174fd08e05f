// CUDA kernels of the Kronecker-eigenbasis ops: the matrix products, the
// orchestration and the operators are shared with the CPU (host/kron_host.h, cuBLAS through
// ATen); this file supplies the two fused elementwise passes as grid-stride
// kernels over the math of vmfdist/kron.h.  The noise uses the same Philox
// streams and the same float / double Box-Muller as the CPU.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "vmfdist/kron.h"
#include "host/kron_host.h"
#include "cuda/launch.cuh"
#include "cuda/random_state.cuh"

namespace vmfdist {
namespace {

using kron::BatchOffsets;
using kron::PowMode;

using launch::blocks_for;
using launch::kThreads;

template <PowMode M, typename scalar_t>
__global__ void scale_mul_kernel(scalar_t* __restrict__ t, const scalar_t* __restrict__ s, BatchOffsets offs,
                                 int64_t per_batch, int64_t n, double power) {
  using opmath_t = at::opmath_type<scalar_t>;
  const opmath_t p = static_cast<opmath_t>(power);
  for (int64_t i : launch::grid_stride(n)) {
    const int64_t b = i / per_batch;
    const int64_t k = i - b * per_batch;
    kron::scale_mul_stretch<M, scalar_t, opmath_t>(t + i, s + offs(b) + k, 1, p);
  }
}

// The Philox stream of row i of matrix b (row r of the tensor): {seed, offset, row}.
struct RowKey {
  uint64_t seed, offset, row;
};

// kron_eigen_noise: one [seed, offset] on the device for the whole tensor, rows counted over it.
struct SharedStream {
  const int64_t* seed_offset;
  __device__ RowKey operator()(int64_t, int64_t r, int64_t) const {
    const SeedOffset so = load_seed_offset(seed_offset);
    return {so.seed, so.offset, static_cast<uint64_t>(r)};
  }
};

// kron_eigen_noise_keyed: matrix b's own [seed, offset] (offset masked to 48 bits), rows counted within it.
struct MatrixStreams {
  const int64_t* keys;
  __device__ RowKey operator()(int64_t b, int64_t, int64_t i) const {
    const SeedOffset so = load_seed_offset(keys + 2 * b);
    return {so.seed, so.offset & ((uint64_t(1) << 48) - 1), static_cast<uint64_t>(i)};
  }
};

// One thread per block of four normals of a row.
template <PowMode M, typename scalar_t, class KeyOf>
__global__ void noise_kernel(scalar_t* __restrict__ z, const scalar_t* __restrict__ s, BatchOffsets offs,
                             int64_t out, int64_t in, int64_t rows, KeyOf key_of, double power) {
  using opmath_t = at::opmath_type<scalar_t>;
  const opmath_t p = static_cast<opmath_t>(power);
  const int64_t nblk = (in + 3) / 4;
  const int64_t n = rows * nblk;
  for (int64_t idx : launch::grid_stride(n)) {
    const int64_t r = idx / nblk;
    const int64_t j = idx - r * nblk;
    const int64_t b = r / out, i = r - b * out;
    const RowKey key = key_of(b, r, i);
    const scalar_t* sr = s + offs(b) + i * in;
    scalar_t* zr = z + r * in;
    opmath_t e[4];
    kron::noise4<scalar_t, opmath_t>(key.seed, key.offset, key.row, static_cast<uint32_t>(j), e);
    for (int k = 0; k < 4; ++k) {
      const int64_t c = 4 * j + k;
      if (c < in) zr[c] = static_cast<scalar_t>(e[k] * kron::spow<M>(static_cast<opmath_t>(sr[c]), p));
    }
  }
}

template <class KeyOf>
void launch_noise(at::Tensor& z, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in, double power,
                  KeyOf key_of) {
  const c10::cuda::CUDAGuard guard(z.device());
  const int64_t rows = z.numel() / in;
  const int64_t n = rows * ((in + 3) / 4);
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, z.scalar_type(), "kron_eigen_noise", [&] {
    kron::dispatch_pow_mode(kron::pow_mode(power), [&]<PowMode M>() {
      noise_kernel<M, scalar_t, KeyOf><<<blocks_for(n), kThreads, 0, launch::stream()>>>(
          z.mutable_data_ptr<scalar_t>(), s.const_data_ptr<scalar_t>(), offs, out, in, rows, key_of, power);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

struct CudaBackend : CudaSeeds {
  static void scale_mul(at::Tensor& t, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                        double power) {
    const c10::cuda::CUDAGuard guard(t.device());
    const int64_t n = t.numel();
    if (n == 0) return;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "kron_eigen_matvec", [&] {
      kron::dispatch_pow_mode(kron::pow_mode(power), [&]<PowMode M>() {
        scale_mul_kernel<M, scalar_t><<<blocks_for(n), kThreads, 0, launch::stream()>>>(
            t.mutable_data_ptr<scalar_t>(), s.const_data_ptr<scalar_t>(), offs, out * in, n, power);
      });
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // [seed, offset] stays on the device (CudaSeeds, random_state.cuh): the kernels read it there.
  static void noise(at::Tensor& z, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                    const Seed& seed_offset, double power) {
    launch_noise(z, s, offs, out, in, power, SharedStream{seed_offset});
  }

  // The keys stay on the device; reading them here would synchronise (the kernel masks the offset).
  static void check_keys(const char*, const at::Tensor&) {}

  static void noise_keyed(at::Tensor& z, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                          const int64_t* keys, double power) {
    launch_noise(z, s, offs, out, in, power, MatrixStreams{keys});
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("kron_eigen_ngd", &kron::Ops<CudaBackend>::ngd);
  m.impl("kron_eigen_moments", &kron::Ops<CudaBackend>::moments);
  m.impl("kron_eigen_matvec", &kron::Ops<CudaBackend>::matvec);
  m.impl("kron_eigen_noise", &kron::Ops<CudaBackend>::noise);
  m.impl("kron_eigen_noise_keyed", &kron::Ops<CudaBackend>::noise_keyed);
  m.impl("kron_eigen_sample", &kron::Ops<CudaBackend>::sample);
}

}  // namespace vmfdist
