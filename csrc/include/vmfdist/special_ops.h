// Elementwise functors over the scalar math in bessel.h.  Each takes (nu, z) as
// double and returns double; the CPU and CUDA loops (csrc/cpu/special_cpu.cpp,
// csrc/cuda/special_cuda.cu) read the caller's dtype, call the functor and cast
// the result back, so float32 inputs are computed in float64 internally.
#pragma once

#include "vmfdist/bessel.h"
#include "vmfdist/macros.h"

namespace vmfdist {

struct IvRatioFn {
  bool complement;
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio(nu, z, complement); }
};

struct IvRatioGradFn {
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio_grad(nu, z); }
};

struct IvRatioGrad2Fn {
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio_grad2(nu, z); }
};

struct LogIvFn {
  bool scaled;
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv(nu, z, scaled); }
};

struct LogIvGradFn {
  bool scaled;
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv_grad(nu, z, scaled); }
};

struct IvRatioApproxFn {
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio_approx(nu, z); }
};

struct LogIvAsymptoticFn {
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv_asymptotic(nu, z); }
};

struct LogIvRatioSeriesFn {
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv_ratio_series(nu, z); }
};

// Two outputs: (lower, upper).
struct IvRatioBoundsFn {
  int theorem;
  VMF_HD void operator()(double nu, double z, double* lo, double* hi) const {
    bessel::iv_ratio_bounds(nu, z, theorem, lo, hi);
  }
};

}  // namespace vmfdist
