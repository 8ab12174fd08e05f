// CPU kernels of the elementwise ops (the table in vmfdist/elementwise.h): an
// at::TensorIterator (csrc/host/elementwise_host.h) walks the broadcast operands by
// their strides, in parallel, and each inner run of elements goes through `loop`
// below -- the same code for every op and dtype.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <type_traits>

#include "host/elementwise_host.h"
#include "vmfdist/elementwise.h"
#include "vmfdist/isa_dispatch.h"
#include "vmfdist/macros.h"

namespace vmfdist {
namespace elementwise {
namespace {

// Elements converted to double and computed together (a block routine's vector loop).
constexpr int64_t kBlock = 256;

template <class Fn>
concept HasBlock = requires(const Fn& fn, const double* a, double* const* out, int64_t m) { fn.block(a, a, out, m); };

// The special functions cost 0.1-10 us an element: small grains parallelise well;
// the block routines (a few ns an element) need larger ones.
constexpr int64_t kBlockGrain = 16384, kScalarGrain = 512;
template <class Fn>
constexpr int64_t kGrain = HasBlock<Fn> ? kBlockGrain : kScalarGrain;

// An op whose cost an element depends on its extra arguments says with cheap() when it is a few
// tens of ns (e.g. the power spherical gradient: a closed form on S^2, a quadrature elsewhere), and
// then takes the block routines' grain: with the small one, a thousand elements went to two OpenMP
// threads for 20 us of work, and with the other core busy the call took milliseconds waiting for it.
template <class Fn>
concept HasCheap = requires(const Fn& fn) { { fn.cheap() } -> std::convertible_to<bool>; };

template <class Fn>
int64_t grain_of(const Fn& fn) {
  if constexpr (HasCheap<Fn>) {
    if (fn.cheap()) return kBlockGrain;
  }
  return kGrain<Fn>;
}

// m elements from p with a byte stride (contiguous and broadcast runs get their own loops).
template <class scalar_t>
VMF_FORCEINLINE void load(const char* p, int64_t stride, int64_t m, double* dst) {
  if (stride == static_cast<int64_t>(sizeof(scalar_t))) {
    const scalar_t* q = reinterpret_cast<const scalar_t*>(p);
    for (int64_t i = 0; i < m; ++i) dst[i] = static_cast<double>(q[i]);
  } else if (stride == 0) {
    const double v = static_cast<double>(*reinterpret_cast<const scalar_t*>(p));
    for (int64_t i = 0; i < m; ++i) dst[i] = v;
  } else {
    for (int64_t i = 0; i < m; ++i) dst[i] = static_cast<double>(*reinterpret_cast<const scalar_t*>(p + i * stride));
  }
}

template <class scalar_t>
VMF_FORCEINLINE void store(char* p, int64_t stride, int64_t m, const double* src) {
  if (stride == static_cast<int64_t>(sizeof(scalar_t))) {
    scalar_t* q = reinterpret_cast<scalar_t*>(p);
    for (int64_t i = 0; i < m; ++i) q[i] = static_cast<scalar_t>(src[i]);
  } else {
    for (int64_t i = 0; i < m; ++i) *reinterpret_cast<scalar_t*>(p + i * stride) = static_cast<scalar_t>(src[i]);
  }
}

// One inner run of n elements: data[k], strides[k] (bytes) are the outputs, then the
// two inputs.  Blocks of kBlock elements are read into double, computed (the
// functor's block routine, or the functor element by element) and rounded once to
// the output dtype.  Called through isa::dispatch (isa_dispatch.h): compiled for baseline
// x86-64 and for AVX2 + FMA, the scalar math inlined into each copy.
template <class Fn>
VMF_FORCEINLINE void compute(const Fn& fn, const double* a, const double* b, double* const* out, int64_t m) {
  if constexpr (HasBlock<Fn>) {
    fn.block(a, b, out, m);
  } else if constexpr (Fn::outputs == 1) {
    for (int64_t i = 0; i < m; ++i) out[0][i] = fn(a[i], b[i]);
  } else {
    for (int64_t i = 0; i < m; ++i) fn(a[i], b[i], &out[0][i], &out[1][i]);
  }
}

template <class scalar_t, class Fn>
void loop(char** data, const int64_t* strides, int64_t n, const Fn& fn) {
  constexpr int kOut = Fn::outputs;
  if constexpr (std::is_same_v<scalar_t, double>) {
    // float64, every operand contiguous: compute in place, without the copies below
    bool contiguous = true;
    for (int k = 0; k < kOut + 2; ++k) contiguous &= strides[k] == static_cast<int64_t>(sizeof(double));
    if (contiguous) {
      const double* a = reinterpret_cast<const double*>(data[kOut]);
      const double* b = reinterpret_cast<const double*>(data[kOut + 1]);
      for (int64_t s = 0; s < n; s += kBlock) {
        double* out[kOut];
        for (int k = 0; k < kOut; ++k) out[k] = reinterpret_cast<double*>(data[k]) + s;
        compute(fn, a + s, b + s, out, std::min(kBlock, n - s));
      }
      return;
    }
  }
  double a[kBlock], b[kBlock], r[kOut][kBlock];
  double* out[kOut];
  for (int k = 0; k < kOut; ++k) out[k] = r[k];
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t m = std::min(kBlock, n - s);
    load<scalar_t>(data[kOut] + s * strides[kOut], strides[kOut], m, a);
    load<scalar_t>(data[kOut + 1] + s * strides[kOut + 1], strides[kOut + 1], m, b);
    compute(fn, a, b, out, m);
    for (int k = 0; k < kOut; ++k) store<scalar_t>(data[k] + s * strides[k], strides[k], m, r[k]);
  }
}

// The CPU kernel of op Fn: Op<Fn>::cpu(a, b, extra...) with Fn's schema signature.
template <class Fn, class E = typename Fn::extra>
struct Op;

template <class Fn, class... E>
struct Op<Fn, Args<E...>> {
  static Result<Fn> cpu(const at::Tensor& a, const at::Tensor& b, E... e) {
    check_extra<Fn>(e...);
    std::array<at::Tensor, Fn::outputs> out;
    at::TensorIterator iter = make_iterator<Fn>(a, b, out);
    const Fn fn{e...};
    constexpr int N = Fn::outputs + 2;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), Fn::name, [&] {
      // a 2-d piece: size1 runs of size0 elements, run j at base[k] + j * strides[N + k]
      iter.for_each(
          [&fn](char** base, const int64_t* strides, int64_t size0, int64_t size1) {
            std::array<char*, N> data;
            for (int64_t j = 0; j < size1; ++j) {
              for (int k = 0; k < N; ++k) data[k] = base[k] + j * strides[N + k];
              isa::dispatch([&] { loop<scalar_t>(data.data(), strides, size0, fn); });
            }
          },
          grain_of(fn));
    });
    return result<Fn>(out);
  }
};

}  // namespace
}  // namespace elementwise

#define VMFDIST_REGISTER_CPU(Fn) m.impl(Fn::name, &::vmfdist::elementwise::Op<Fn>::cpu);
TORCH_LIBRARY_IMPL(vmfdist, CPU, m) { VMFDIST_ELEMENTWISE_OPS(VMFDIST_REGISTER_CPU) }
#undef VMFDIST_REGISTER_CPU

}  // namespace vmfdist
