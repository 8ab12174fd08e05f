// The elementwise ops of the extension, written once: one functor per op over the
// scalar math (bessel.h, vmf.h, power_spherical.h) and the table VMFDIST_ELEMENTWISE_OPS listing them.
// csrc/cpu/elementwise_cpu.cpp and csrc/cuda/elementwise_cuda.cu expand the table
// into their kernels and TORCH_LIBRARY_IMPL registrations; csrc/host/elementwise_host.h
// checks the arguments and sets up the broadcasting (at::TensorIterator, no copies).
// docs/adding_an_op.md walks through adding an op.
//
// An op takes two tensors (broadcast together, promoted to a common floating dtype)
// and the scalar arguments listed in `extra`, in schema order.  Its functor holds
//   name            the schema name (ops.cpp);
//   inputs          the names of the two tensor arguments (for error messages);
//   extra           Args<T...>: the types of the scalar arguments, which are also the
//                   functor's data members, in the same order (the functor is built
//                   as Fn{extra...});
//   outputs         1, or 2 for ops returning a pair;
//   operator()      the math at one element, VMF_HD: (double, double) -> double, or
//                   (double, double, double*, double*) -> void for two outputs.  The
//                   loops read the caller's dtype, compute in double and round once.
// and optionally
//   valid(extra...) / requirement   a check of the scalar arguments and its message;
//   block(a, b, out, m)             a host routine for m elements at once (double
//                                   arrays; out[k] is output k) that the CPU loop
//                                   calls instead of operator() -- for cheap ops
//                                   whose per-element form does not vectorise.
#pragma once

#include <cstdint>

#include "vmfdist/bessel.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/macros.h"
#include "vmfdist/power_spherical.h"
#include "vmfdist/vmf.h"

namespace vmfdist {
namespace elementwise {

// The types of an op's scalar arguments after its two tensors.
template <class... T>
struct Args {};

struct IvRatio {
  static constexpr const char* name = "bessel_iv_ratio";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<bool>;
  static constexpr int outputs = 1;
  bool complement;
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio(nu, z, complement); }
};

struct IvRatioGrad {
  static constexpr const char* name = "bessel_iv_ratio_grad";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<>;
  static constexpr int outputs = 1;
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio_grad(nu, z); }
};

// d^2R/dz^2.
struct IvRatioGrad2 {
  static constexpr const char* name = "bessel_iv_ratio_grad2";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<>;
  static constexpr int outputs = 1;
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio_grad2(nu, z); }
};

struct LogIv {
  static constexpr const char* name = "log_bessel_iv";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<bool>;
  static constexpr int outputs = 1;
  bool scaled;
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv(nu, z, scaled); }
};

struct LogIvGrad {
  static constexpr const char* name = "log_bessel_iv_grad";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<bool>;
  static constexpr int outputs = 1;
  bool scaled;
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv_grad(nu, z, scaled); }
};

struct LogIvAsymptotic {
  static constexpr const char* name = "log_bessel_iv_asymptotic";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<>;
  static constexpr int outputs = 1;
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv_asymptotic(nu, z); }
};

struct LogIvRatioSeries {
  static constexpr const char* name = "log_bessel_iv_series";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<>;
  static constexpr int outputs = 1;
  VMF_HD double operator()(double nu, double z) const { return bessel::log_iv_ratio_series(nu, z); }
};

// The bound formulas cost a few divisions and square roots an element, so a scalar
// loop around iv_ratio_bounds is bound by the general hypot (~15 ns a call).  The CPU
// block routine first runs the branch-free iv_ratio_bounds_fast over the whole block
// (a loop the compiler vectorises), then redoes the rare elements outside
// bounds_fast_range (NaN, out of domain, z = 0 or inf, extreme magnitudes) with the
// general function.
template <int Theorem>
inline void bounds_block(const double* __restrict__ nu, const double* __restrict__ z, double* __restrict__ lo,
                         double* __restrict__ hi, int64_t m) {
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    bessel::iv_ratio_bounds_fast<Theorem>(nu[i], z[i], &lo[i], &hi[i]);
    bad |= static_cast<int>(!bessel::bounds_fast_range<Theorem>(nu[i], z[i]));
  }
  if (bad) {
    for (int64_t i = 0; i < m; ++i) {
      if (!bessel::bounds_fast_range<Theorem>(nu[i], z[i])) bessel::iv_ratio_bounds(nu[i], z[i], Theorem, &lo[i], &hi[i]);
    }
  }
}

// Two outputs: (lower, upper) of theorem 4 or 5.
struct IvRatioBounds {
  static constexpr const char* name = "bessel_iv_ratio_bounds";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<int64_t>;
  static constexpr int outputs = 2;
  static constexpr const char* requirement = "theorem must be 4 or 5";
  static constexpr bool valid(int64_t theorem) { return theorem == 4 || theorem == 5; }
  int64_t theorem;
  VMF_HD void operator()(double nu, double z, double* lo, double* hi) const {
    bessel::iv_ratio_bounds(nu, z, static_cast<int>(theorem), lo, hi);
  }
  void block(const double* nu, const double* z, double* const* out, int64_t m) const {
    // a dispatch of its own: this loop vectorises only when compiled by itself
    isa::dispatch([&] {
      if (theorem == 5) {
        bounds_block<5>(nu, z, out[0], out[1], m);
      } else {
        bounds_block<4>(nu, z, out[0], out[1], m);
      }
    });
  }
};

// The papers' approximation: the mean of theorem 5's bounds.
struct IvRatioApprox {
  static constexpr const char* name = "bessel_iv_ratio_approx";
  static constexpr const char* inputs[2] = {"nu", "z"};
  using extra = Args<>;
  static constexpr int outputs = 1;
  VMF_HD double operator()(double nu, double z) const { return bessel::iv_ratio_approx(nu, z); }
  void block(const double* nu, const double* z, double* const* out, int64_t m) const {
    double hi[256];
    for (int64_t s = 0; s < m; s += 256) {
      const int64_t k = m - s < 256 ? m - s : 256;
      double* lo = out[0] + s;
      isa::dispatch([&] {
        bounds_block<5>(nu + s, z + s, lo, hi, k);
        for (int64_t i = 0; i < k; ++i) lo[i] = 0.5 * (lo[i] + hi[i]);
      });
    }
  }
};

// dw/dkappa of the vMF marginal on S^{dim-1} at w = 1 - one_minus_w.
struct VmfMarginalGrad {
  static constexpr const char* name = "vmf_marginal_grad";
  static constexpr const char* inputs[2] = {"one_minus_w", "concentration"};
  using extra = Args<int64_t>;
  static constexpr int outputs = 1;
  static constexpr const char* requirement = "dim must be at least 2";
  static constexpr bool valid(int64_t dim) { return dim >= 2; }
  int64_t dim;
  VMF_HD double operator()(double omw, double kappa) const {
    return vmf::dw_dkappa(omw, kappa, static_cast<double>(dim));
  }
};

// dt/dkappa of the power spherical marginal on S^{dim-1} at t = 1 - one_minus_t.
struct PowerSphericalMarginalGrad {
  static constexpr const char* name = "power_spherical_marginal_grad";
  static constexpr const char* inputs[2] = {"one_minus_t", "concentration"};
  using extra = Args<int64_t>;
  static constexpr int outputs = 1;
  static constexpr const char* requirement = "dim must be at least 2";
  static constexpr bool valid(int64_t dim) { return dim >= 2; }
  int64_t dim;
  VMF_HD double operator()(double omt, double kappa) const {
    return power_spherical::dt_dkappa(omt, kappa, static_cast<double>(dim));
  }
  // for the CPU's parallel grain: S^2's closed form costs tens of ns an element, the quadrature ~1 us
  bool cheap() const { return dim == 3; }
};

}  // namespace elementwise
}  // namespace vmfdist

// Every elementwise op, one entry each: X(functor).  Adding an op here registers
// its CPU and CUDA kernels.
#define VMFDIST_ELEMENTWISE_OPS(X)  \
  X(::vmfdist::elementwise::IvRatio)         \
  X(::vmfdist::elementwise::IvRatioGrad)     \
  X(::vmfdist::elementwise::IvRatioGrad2)    \
  X(::vmfdist::elementwise::LogIv)           \
  X(::vmfdist::elementwise::LogIvGrad)       \
  X(::vmfdist::elementwise::LogIvAsymptotic) \
  X(::vmfdist::elementwise::LogIvRatioSeries) \
  X(::vmfdist::elementwise::IvRatioBounds)   \
  X(::vmfdist::elementwise::IvRatioApprox)   \
  X(::vmfdist::elementwise::VmfMarginalGrad) \
  X(::vmfdist::elementwise::PowerSphericalMarginalGrad)
