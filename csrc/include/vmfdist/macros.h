// Portability macros shared by every header under csrc/include/vmfdist/.
//
// The math headers are written once as templates marked VMF_HD so that the CPU
// kernels (csrc/cpu/*.cpp, compiled by the host compiler) and the CUDA kernels
// (csrc/cuda/*.cu, compiled by nvcc) call the very same code.  The CPU instruction-set
// dispatch (host code only) is in isa_dispatch.h.
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

namespace vmfdist {
// NaN/inf tests that behave the same in host and device code (no -ffast-math here).
VMF_INLINE bool is_nan(double x) { return x != x; }
VMF_INLINE bool is_inf(double x) { return x == static_cast<double>(INFINITY) || x == -static_cast<double>(INFINITY); }
}  // namespace vmfdist
