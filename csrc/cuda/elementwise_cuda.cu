// CUDA kernels of the elementwise ops (the table in vmfdist/elementwise.h): the
// at::TensorIterator of csrc/host/elementwise_host.h gives the broadcast operands'
// strides; a contiguous iteration indexes the pointers directly, any other one maps
// each linear index to element offsets with ATen's OffsetCalculator (32-bit indices,
// the iteration split where it is larger).  Each element is read into double, the
// functor computes, the result is rounded once to the output dtype -- as on the CPU.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <ATen/cuda/detail/OffsetCalculator.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>

#include "cuda/launch.cuh"
#include "host/elementwise_host.h"
#include "vmfdist/elementwise.h"

namespace vmfdist {
namespace elementwise {
namespace {

// The operands' base pointers: the outputs, then the two inputs.
template <int N>
struct Pointers {
  char* p[N];
};

// Element offsets of a contiguous iteration: the linear index itself.
struct ContiguousOffsets {
  struct Same {
    int64_t i;
    __device__ int64_t operator[](int) const { return i; }
  };
  __device__ Same get(int64_t i) const { return {i}; }
};

// Element offsets from ATen's OffsetCalculator (one division per dimension).
template <int N>
struct StridedOffsets {
  OffsetCalculator<N> calc;
  __device__ auto get(int64_t i) const { return calc.get(static_cast<uint32_t>(i)); }
};

template <class scalar_t, class Fn, class Offsets>
__global__ void elementwise_kernel(Pointers<Fn::outputs + 2> ptr, Offsets offs, int64_t n, Fn fn) {
  constexpr int kOut = Fn::outputs;
  for (int64_t i : launch::grid_stride(n)) {
    const auto o = offs.get(i);
    const double a = static_cast<double>(reinterpret_cast<const scalar_t*>(ptr.p[kOut])[o[kOut]]);
    const double b = static_cast<double>(reinterpret_cast<const scalar_t*>(ptr.p[kOut + 1])[o[kOut + 1]]);
    if constexpr (kOut == 1) {
      reinterpret_cast<scalar_t*>(ptr.p[0])[o[0]] = static_cast<scalar_t>(fn(a, b));
    } else {
      double r0, r1;
      fn(a, b, &r0, &r1);
      reinterpret_cast<scalar_t*>(ptr.p[0])[o[0]] = static_cast<scalar_t>(r0);
      reinterpret_cast<scalar_t*>(ptr.p[1])[o[1]] = static_cast<scalar_t>(r1);
    }
  }
}

template <class scalar_t, class Fn>
void launch_elementwise(at::TensorIteratorBase& iter, const Fn& fn) {
  constexpr int N = Fn::outputs + 2;
  const int64_t n = iter.numel();
  if (n == 0) return;
  Pointers<N> ptr;
  for (int k = 0; k < N; ++k) ptr.p[k] = static_cast<char*>(iter.data_ptr(k));
  if (iter.is_contiguous()) {
    elementwise_kernel<scalar_t><<<launch::blocks_for(n), launch::kThreads, 0, launch::stream()>>>(
        ptr, ContiguousOffsets{}, n, fn);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else if (iter.can_use_32bit_indexing()) {
    elementwise_kernel<scalar_t><<<launch::blocks_for(n), launch::kThreads, 0, launch::stream()>>>(
        ptr, StridedOffsets<N>{make_element_offset_calculator<N>(iter)}, n, fn);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    for (auto& sub : iter.with_32bit_indexing()) launch_elementwise<scalar_t>(sub, fn);
  }
}

// The CUDA kernel of op Fn: Op<Fn>::cuda(a, b, extra...) with Fn's schema signature.
template <class Fn, class E = typename Fn::extra>
struct Op;

template <class Fn, class... E>
struct Op<Fn, Args<E...>> {
  static Result<Fn> cuda(const at::Tensor& a, const at::Tensor& b, E... e) {
    check_extra<Fn>(e...);
    std::array<at::Tensor, Fn::outputs> out;
    at::TensorIterator iter = make_iterator<Fn>(a, b, out);
    const c10::cuda::CUDAGuard guard(iter.device());
    const Fn fn{e...};
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), Fn::name,
                                    [&] { launch_elementwise<scalar_t>(iter, fn); });
    return result<Fn>(out);
  }
};

}  // namespace
}  // namespace elementwise

#define VMFDIST_REGISTER_CUDA(Fn) m.impl(Fn::name, &::vmfdist::elementwise::Op<Fn>::cuda);
TORCH_LIBRARY_IMPL(vmfdist, CUDA, m) { VMFDIST_ELEMENTWISE_OPS(VMFDIST_REGISTER_CUDA) }
#undef VMFDIST_REGISTER_CUDA

}  // namespace vmfdist
