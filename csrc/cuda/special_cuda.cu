// CUDA kernels for the Bessel special functions: grid-stride loops over the same
// host-device functors (vmfdist/special_ops.h) that the CPU kernels call.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "vmfdist/special_ops.h"
#include "host/tensor_checks.h"
#include "cuda/launch.cuh"

namespace vmfdist {
namespace {

using launch::blocks_for;
using launch::kThreads;

template <class scalar_t, class Fn>
__global__ void binary_kernel(const scalar_t* __restrict__ nu, const scalar_t* __restrict__ z,
                              scalar_t* __restrict__ out, int64_t n, Fn fn) {
  for (int64_t i : launch::grid_stride(n)) {
    out[i] = static_cast<scalar_t>(fn(static_cast<double>(nu[i]), static_cast<double>(z[i])));
  }
}

template <class scalar_t, class Fn>
__global__ void bounds_kernel(const scalar_t* __restrict__ nu, const scalar_t* __restrict__ z,
                              scalar_t* __restrict__ lo, scalar_t* __restrict__ hi, int64_t n, Fn fn) {
  for (int64_t i : launch::grid_stride(n)) {
    double l, h;
    fn(static_cast<double>(nu[i]), static_cast<double>(z[i]), &l, &h);
    lo[i] = static_cast<scalar_t>(l);
    hi[i] = static_cast<scalar_t>(h);
  }
}

template <class Fn>
at::Tensor unary_out_cuda(const at::Tensor& nu_in, const at::Tensor& z_in, const char* op, Fn fn) {
  auto [nu, z] = prepare_binary(nu_in, z_in, op);
  const c10::cuda::CUDAGuard guard(nu.device());
  at::Tensor out = at::empty_like(nu);
  const int64_t n = nu.numel();
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, nu.scalar_type(), "vmfdist_special", [&] {
    binary_kernel<scalar_t><<<blocks_for(n), kThreads, 0, launch::stream()>>>(
        nu.const_data_ptr<scalar_t>(), z.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), n, fn);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor bessel_iv_ratio_cuda(const at::Tensor& nu, const at::Tensor& z, bool complement) {
  return unary_out_cuda(nu, z, "bessel_iv_ratio", IvRatioFn{complement});
}
at::Tensor bessel_iv_ratio_grad_cuda(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cuda(nu, z, "bessel_iv_ratio_grad", IvRatioGradFn{});
}
at::Tensor log_bessel_iv_cuda(const at::Tensor& nu, const at::Tensor& z, bool scaled) {
  return unary_out_cuda(nu, z, "log_bessel_iv", LogIvFn{scaled});
}
at::Tensor log_bessel_iv_grad_cuda(const at::Tensor& nu, const at::Tensor& z, bool scaled) {
  return unary_out_cuda(nu, z, "log_bessel_iv_grad", LogIvGradFn{scaled});
}
at::Tensor bessel_iv_ratio_approx_cuda(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cuda(nu, z, "bessel_iv_ratio_approx", IvRatioApproxFn{});
}
at::Tensor log_bessel_iv_asymptotic_cuda(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cuda(nu, z, "log_bessel_iv_asymptotic", LogIvAsymptoticFn{});
}
at::Tensor log_bessel_iv_series_cuda(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cuda(nu, z, "log_bessel_iv_series", LogIvRatioSeriesFn{});
}

std::tuple<at::Tensor, at::Tensor> bessel_iv_ratio_bounds_cuda(const at::Tensor& nu_in, const at::Tensor& z_in,
                                                               int64_t theorem) {
  TORCH_CHECK(theorem == 4 || theorem == 5, "bessel_iv_ratio_bounds: theorem must be 4 or 5, got ", theorem);
  auto [nu, z] = prepare_binary(nu_in, z_in, "bessel_iv_ratio_bounds");
  const c10::cuda::CUDAGuard guard(nu.device());
  at::Tensor lo = at::empty_like(nu), hi = at::empty_like(nu);
  const int64_t n = nu.numel();
  if (n == 0) return {lo, hi};
  const IvRatioBoundsFn fn{static_cast<int>(theorem)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, nu.scalar_type(), "bessel_iv_ratio_bounds", [&] {
    bounds_kernel<scalar_t><<<blocks_for(n), kThreads, 0, launch::stream()>>>(
        nu.const_data_ptr<scalar_t>(), z.const_data_ptr<scalar_t>(), lo.mutable_data_ptr<scalar_t>(),
        hi.mutable_data_ptr<scalar_t>(), n, fn);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {lo, hi};
}

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) {
  m.impl("bessel_iv_ratio", &bessel_iv_ratio_cuda);
  m.impl("bessel_iv_ratio_grad", &bessel_iv_ratio_grad_cuda);
  m.impl("log_bessel_iv", &log_bessel_iv_cuda);
  m.impl("log_bessel_iv_grad", &log_bessel_iv_grad_cuda);
  m.impl("bessel_iv_ratio_bounds", &bessel_iv_ratio_bounds_cuda);
  m.impl("bessel_iv_ratio_approx", &bessel_iv_ratio_approx_cuda);
  m.impl("log_bessel_iv_asymptotic", &log_bessel_iv_asymptotic_cuda);
  m.impl("log_bessel_iv_series", &log_bessel_iv_series_cuda);
}

}  // namespace vmfdist
