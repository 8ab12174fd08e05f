// CPU instruction-set dispatch, one idiom for every hot CPU loop.  The extension is
// built for baseline x86-64; vmfdist::isa::dispatch(f) runs f() in a copy compiled for
// AVX2 + FMA when the CPU has both, in the baseline copy otherwise.  f is inlined
// (flatten) into the AVX2 + FMA copy, so everything it calls -- the vectorised loops
// of fast_normal.h, the vMF row passes, the Kronecker and radial elementwise passes,
// the double-double math of bessel.h and dd.h -- is compiled for that target.  Call it
// around a whole stretch of work (one parallel_for task, one block of elements), not
// per element: each call tests a flag and makes one call.  A loop that vectorises best
// compiled by itself (the Philox lanes of fast_normal.h, the bounds of elementwise.h)
// takes a dispatch of its own inside: run_avx2_fma is noinline, so an inner dispatch
// keeps its own copy instead of being flattened into the outer one.  (GCC's
// target_clones, used here before, cannot express this: a clone names one feature
// ("avx2" does not imply FMA), and GCC 12's resolver for "arch=x86-64-v3" tests the CPU
// model, not its features -- it chose the baseline copy on an AVX2 + FMA Xeon here.)
// Results are bit-identical in every copy: the build forbids floating-point
// contraction (-ffp-contract=off), so the copies differ only in vector width and in
// computing the explicit fma() calls (correctly rounded either way) with the
// instruction instead of a call into libm.  Host code only (under nvcc, or on other
// compilers and architectures, dispatch just calls f).
//
// Kept apart from macros.h (the host-device portability macros): no ATen, no other
// vmfdist header.  The headers with host-side block routines beside their VMF_HD math
// (fast_normal.h, elementwise.h) include it, so .cu files see it through them; no
// kernel calls it, and under nvcc VMF_ISA_DISPATCH is left undefined.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
#define VMF_ISA_DISPATCH 1
#endif

namespace vmfdist {
namespace isa {
#ifdef VMF_ISA_DISPATCH
inline bool has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
// noinline: a dispatch inside another one's f keeps its own copy (see above).
template <class F>
__attribute__((target("avx2,fma"), flatten, noinline)) void run_avx2_fma(const F& f) {
  f();
}
#endif
// f() in the AVX2 + FMA copy where the CPU has both, in the baseline copy otherwise.
template <class F>
inline void dispatch(const F& f) {
#ifdef VMF_ISA_DISPATCH
  if (has_avx2_fma()) {
    run_avx2_fma(f);
    return;
  }
#endif
  f();
}
}  // namespace isa
}  // namespace vmfdist
