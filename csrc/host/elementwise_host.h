// Host-side set-up of the elementwise ops (vmfdist/elementwise.h), shared by the CPU
// and CUDA wrappers: argument checks, the common dtype, the broadcast shape and an
// at::TensorIterator over the outputs and the two inputs.  Broadcasting is done by
// the iterator's strides (0 along broadcast dimensions): no input is expanded or
// copied to the output's size.  Torch headers; not for device code.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>

#include <array>
#include <vector>

#include "host/tensor_checks.h"
#include "vmfdist/elementwise.h"

namespace vmfdist {
namespace elementwise {

// The scalar arguments of Fn, checked with Fn::valid where the op has one.
template <class Fn, class... E>
void check_extra(E... e) {
  if constexpr (requires { Fn::valid(e...); }) {
    TORCH_CHECK(Fn::valid(e...), Fn::name, ": ", Fn::requirement, ", got ", e...);
  }
}

// The iterator of op Fn over (a, b): both real and on the same device; they broadcast
// together; the result dtype is their promoted dtype, or the default float dtype when
// that is not floating (integer and bool inputs).  Allocates the Fn::outputs outputs,
// contiguous, of the broadcast shape and that dtype (the fake kernels in
// vmfdist/_ops promise the same).  An input is converted only when its dtype differs
// from the result's, at its own size.
template <class Fn>
at::TensorIterator make_iterator(const at::Tensor& a, const at::Tensor& b, std::array<at::Tensor, Fn::outputs>& out) {
  const char* op = Fn::name;
  const char* an = Fn::inputs[0];
  const char* bn = Fn::inputs[1];
  check_same_device(op, {{an, a}, {bn, b}});
  TORCH_CHECK(!a.is_complex(), op, ": ", an, " must be real, got dtype ", a.scalar_type());
  TORCH_CHECK(!b.is_complex(), op, ": ", bn, " must be real, got dtype ", b.scalar_type());
  at::ScalarType dt = at::result_type(a, b);
  if (!at::isFloatingType(dt)) dt = at::typeMetaToScalarType(at::get_default_dtype());
  std::vector<int64_t> shape;
  try {
    shape = at::infer_size(a.sizes(), b.sizes());
  } catch (const c10::Error&) {
    TORCH_CHECK(false, op, ": ", an, " (shape ", a.sizes(), ") and ", bn, " (shape ", b.sizes(),
                ") cannot be broadcast together");
  }
  at::TensorIteratorConfig config;
  for (auto& o : out) {
    o = at::empty(shape, a.options().dtype(dt));
    config.add_owned_output(o);
  }
  config.add_owned_const_input(a.to(dt));
  config.add_owned_const_input(b.to(dt));
  return config.build();
}

// The value an op's wrapper returns: its output, or the pair of outputs.
template <class Fn>
using Result = std::conditional_t<Fn::outputs == 1, at::Tensor, std::tuple<at::Tensor, at::Tensor>>;

template <class Fn>
Result<Fn> result(std::array<at::Tensor, Fn::outputs>& out) {
  if constexpr (Fn::outputs == 1) {
    return out[0];
  } else {
    return {out[0], out[1]};
  }
}

}  // namespace elementwise
}  // namespace vmfdist
