// CPU kernels for the Bessel special functions: at::parallel_for loops over the
// host-device functors in vmfdist/special_ops.h.
#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vmfdist/special_ops.h"
#include "host/tensor_checks.h"

namespace vmfdist {
namespace {

// The Bessel kernels cost 0.1-10 us an element: small grains parallelise well.
constexpr int64_t kGrain = 512;

template <class scalar_t, class Fn>
inline void elementwise(const scalar_t* pn, const scalar_t* pz, scalar_t* po, int64_t begin, int64_t end,
                        const Fn& fn) {
  for (int64_t i = begin; i < end; ++i) {
    po[i] = static_cast<scalar_t>(fn(static_cast<double>(pn[i]), static_cast<double>(pz[i])));
  }
}

// The double-double arithmetic in bessel.h and dd.h (error-free products) and the
// Perron recurrence call fma().  The extension is built for baseline x86-64, where
// fma() is a call into libm -- with every live xmm register spilled around it -- and
// that call dominated the cost of the Bessel kernels.  On x86 the loop is therefore
// compiled a second time for CPUs with the FMA instruction set: target("fma") lets the
// compiler emit vfmadd for fma(), and flatten inlines the whole scalar math into that
// copy (so no out-of-line function is compiled with FMA, and the baseline copy is
// untouched).  The results are identical: fma() is correctly rounded either way, and
// -ffp-contract=off still forbids contracting anything else.  Chosen at run time.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define VMFDIST_FMA_DISPATCH 1
template <class scalar_t, class Fn>
__attribute__((target("fma"), flatten)) void elementwise_fma(const scalar_t* pn, const scalar_t* pz, scalar_t* po,
                                                            int64_t begin, int64_t end, const Fn& fn) {
  elementwise(pn, pz, po, begin, end, fn);
}
inline bool cpu_has_fma() {
  static const bool has = __builtin_cpu_supports("fma");
  return has;
}
#endif

template <class Fn>
at::Tensor unary_out_cpu(const at::Tensor& nu_in, const at::Tensor& z_in, const char* op, Fn fn) {
  auto [nu, z] = prepare_binary(nu_in, z_in, op);
  at::Tensor out = at::empty_like(nu);
  const int64_t n = nu.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, nu.scalar_type(), "vmfdist_special", [&] {
    const scalar_t* pn = nu.const_data_ptr<scalar_t>();
    const scalar_t* pz = z.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
#ifdef VMFDIST_FMA_DISPATCH
      if (cpu_has_fma()) {
        elementwise_fma(pn, pz, po, begin, end, fn);
        return;
      }
#endif
      elementwise(pn, pz, po, begin, end, fn);
    });
  });
  return out;
}

at::Tensor bessel_iv_ratio_cpu(const at::Tensor& nu, const at::Tensor& z, bool complement) {
  return unary_out_cpu(nu, z, "bessel_iv_ratio", IvRatioFn{complement});
}
at::Tensor bessel_iv_ratio_grad_cpu(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cpu(nu, z, "bessel_iv_ratio_grad", IvRatioGradFn{});
}
at::Tensor bessel_iv_ratio_grad2_cpu(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cpu(nu, z, "bessel_iv_ratio_grad2", IvRatioGrad2Fn{});
}
at::Tensor log_bessel_iv_cpu(const at::Tensor& nu, const at::Tensor& z, bool scaled) {
  return unary_out_cpu(nu, z, "log_bessel_iv", LogIvFn{scaled});
}
at::Tensor log_bessel_iv_grad_cpu(const at::Tensor& nu, const at::Tensor& z, bool scaled) {
  return unary_out_cpu(nu, z, "log_bessel_iv_grad", LogIvGradFn{scaled});
}
at::Tensor log_bessel_iv_asymptotic_cpu(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cpu(nu, z, "log_bessel_iv_asymptotic", LogIvAsymptoticFn{});
}
at::Tensor log_bessel_iv_series_cpu(const at::Tensor& nu, const at::Tensor& z) {
  return unary_out_cpu(nu, z, "log_bessel_iv_series", LogIvRatioSeriesFn{});
}

// The bound kernels (and the approximation, their mean) cost a few divisions and square
// roots an element, so a scalar loop around iv_ratio_bounds was bound by glibc's hypot
// (~15 ns a call) -- slower than the eager torch composite.  Here each block of kBlock
// elements first runs the branch-free iv_ratio_bounds_fast (a loop the compiler
// vectorises; compiled a second time for AVX2 below), then redoes the rare elements
// outside bounds_fast_range (NaN, out of domain, z = 0 or inf, extreme magnitudes) with
// the general function.  Approx writes (lower + upper) / 2 into `lo` and ignores `hi`.
template <int Theorem, bool Approx, class scalar_t>
inline void bounds_loop(const scalar_t* pn, const scalar_t* pz, scalar_t* pl, scalar_t* ph, int64_t begin,
                        int64_t end) {
  constexpr int64_t kBlock = 256;
  double lo[kBlock], hi[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t m = std::min<int64_t>(kBlock, end - b);
    const scalar_t* bn = pn + b;
    const scalar_t* bz = pz + b;
    int bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      const double nu = static_cast<double>(bn[i]), z = static_cast<double>(bz[i]);
      bessel::iv_ratio_bounds_fast<Theorem>(nu, z, &lo[i], &hi[i]);
      bad |= static_cast<int>(!bessel::bounds_fast_range<Theorem>(nu, z));
    }
    if (bad) {
      for (int64_t i = 0; i < m; ++i) {
        const double nu = static_cast<double>(bn[i]), z = static_cast<double>(bz[i]);
        if (!bessel::bounds_fast_range<Theorem>(nu, z)) bessel::iv_ratio_bounds(nu, z, Theorem, &lo[i], &hi[i]);
      }
    }
    if (Approx) {
      for (int64_t i = 0; i < m; ++i) pl[b + i] = static_cast<scalar_t>(0.5 * (lo[i] + hi[i]));
    } else {
      for (int64_t i = 0; i < m; ++i) {
        pl[b + i] = static_cast<scalar_t>(lo[i]);
        ph[b + i] = static_cast<scalar_t>(hi[i]);
      }
    }
  }
}

#ifdef VMFDIST_FMA_DISPATCH
template <int Theorem, bool Approx, class scalar_t>
__attribute__((target("avx2"), flatten)) void bounds_loop_avx2(const scalar_t* pn, const scalar_t* pz, scalar_t* pl,
                                                             scalar_t* ph, int64_t begin, int64_t end) {
  bounds_loop<Theorem, Approx>(pn, pz, pl, ph, begin, end);
}
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// lo (and hi unless Approx) of the same shape as the prepared nu, z.
template <int Theorem, bool Approx>
void bounds_cpu(const at::Tensor& nu, const at::Tensor& z, at::Tensor& lo, at::Tensor& hi) {
  const int64_t n = nu.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, nu.scalar_type(), "bessel_iv_ratio_bounds", [&] {
    const scalar_t* pn = nu.const_data_ptr<scalar_t>();
    const scalar_t* pz = z.const_data_ptr<scalar_t>();
    scalar_t* pl = lo.mutable_data_ptr<scalar_t>();
    scalar_t* ph = Approx ? nullptr : hi.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
#ifdef VMFDIST_FMA_DISPATCH
      if (cpu_has_avx2()) {
        bounds_loop_avx2<Theorem, Approx>(pn, pz, pl, ph, begin, end);
        return;
      }
#endif
      bounds_loop<Theorem, Approx>(pn, pz, pl, ph, begin, end);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> bessel_iv_ratio_bounds_cpu(const at::Tensor& nu_in, const at::Tensor& z_in,
                                                              int64_t theorem) {
  TORCH_CHECK(theorem == 4 || theorem == 5, "bessel_iv_ratio_bounds: theorem must be 4 or 5, got ", theorem);
  auto [nu, z] = prepare_binary(nu_in, z_in, "bessel_iv_ratio_bounds");
  at::Tensor lo = at::empty_like(nu), hi = at::empty_like(nu);
  if (theorem == 5) {
    bounds_cpu<5, false>(nu, z, lo, hi);
  } else {
    bounds_cpu<4, false>(nu, z, lo, hi);
  }
  return {lo, hi};
}

at::Tensor bessel_iv_ratio_approx_cpu(const at::Tensor& nu_in, const at::Tensor& z_in) {
  auto [nu, z] = prepare_binary(nu_in, z_in, "bessel_iv_ratio_approx");
  at::Tensor out = at::empty_like(nu);
  bounds_cpu<5, true>(nu, z, out, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("bessel_iv_ratio", &bessel_iv_ratio_cpu);
  m.impl("bessel_iv_ratio_grad", &bessel_iv_ratio_grad_cpu);
  m.impl("bessel_iv_ratio_grad2", &bessel_iv_ratio_grad2_cpu);
  m.impl("log_bessel_iv", &log_bessel_iv_cpu);
  m.impl("log_bessel_iv_grad", &log_bessel_iv_grad_cpu);
  m.impl("bessel_iv_ratio_bounds", &bessel_iv_ratio_bounds_cpu);
  m.impl("bessel_iv_ratio_approx", &bessel_iv_ratio_approx_cpu);
  m.impl("log_bessel_iv_asymptotic", &log_bessel_iv_asymptotic_cpu);
  m.impl("log_bessel_iv_series", &log_bessel_iv_series_cpu);
}

}  // namespace vmfdist
