// Portability macros shared by every header under csrc/include/vmfdist/.
//
// The math headers are written once as templates marked VMF_HD so that the CPU
// kernels (csrc/cpu/*.cpp, compiled by the host compiler) and the CUDA kernels
// (csrc/cuda/*.cu, compiled by nvcc) call the very same code.
#pragma once

#include <cmath>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define VMF_HD __host__ __device__
#else
#define VMF_HD
#endif

// Constant tables and scalars used inside VMF_HD functions: nvcc compiles a .cu
// file twice, and the device pass needs the table in device memory while the
// host pass needs an ordinary constexpr array.
#if defined(__CUDA_ARCH__)
#define VMF_CONSTANT __device__ constexpr
#else
#define VMF_CONSTANT constexpr
#endif

#define VMF_INLINE VMF_HD inline

// For small functions called inside loops that must vectorise (fast_normal.h).
#if defined(__CUDACC__)
#define VMF_FORCEINLINE VMF_HD __forceinline__
#elif defined(__GNUC__)
#define VMF_FORCEINLINE inline __attribute__((always_inline))
#else
#define VMF_FORCEINLINE inline
#endif

// CPU instruction-set dispatch -- the one idiom of the project.  A CPU loop marked
// VMF_TARGET_CLONES is compiled twice by GCC (function multi-versioning): for baseline
// x86-64 and for x86-64-v3 (AVX2 + FMA, Haswell and later), and the loader picks the
// copy for the running CPU once.  Results are bit-identical in both copies: the build
// forbids floating-point contraction (-ffp-contract=off), so the v3 copy differs only
// in vector width and in computing the explicit fma() calls of the math (correctly
// rounded either way) with the instruction instead of a call into libm.  Add
// VMF_FLATTEN where the loop calls the scalar math, so that the math is inlined into
// (and compiled for) each copy.  Host code only; empty elsewhere.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
#define VMF_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define VMF_FLATTEN __attribute__((flatten))
#else
#define VMF_TARGET_CLONES
#define VMF_FLATTEN
#endif

namespace vmfdist {
// NaN/inf tests that behave the same in host and device code (no -ffast-math here).
VMF_INLINE bool is_nan(double x) { return x != x; }
VMF_INLINE bool is_inf(double x) { return x == static_cast<double>(INFINITY) || x == -static_cast<double>(INFINITY); }
}  // namespace vmfdist
