// Host-side argument handling shared by the CPU and CUDA operator wrappers
// (torch headers; not for device code).
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <utility>
#include <vector>

namespace vmfdist {

// Broadcast (nu, z) to a common shape and a common floating dtype, contiguous.
// Integer inputs are promoted to the default float dtype; complex is rejected.
inline std::pair<at::Tensor, at::Tensor> prepare_binary(const at::Tensor& nu, const at::Tensor& z,
                                                        const char* op) {
  TORCH_CHECK(nu.device() == z.device(), op, ": nu and z must be on the same device, got nu on ",
              nu.device(), " and z on ", z.device());
  TORCH_CHECK(!nu.is_complex(), op, ": nu must be real, got dtype ", nu.scalar_type());
  TORCH_CHECK(!z.is_complex(), op, ": z must be real, got dtype ", z.scalar_type());
  at::ScalarType dt = at::result_type(nu, z);
  if (!at::isFloatingType(dt)) dt = at::typeMetaToScalarType(at::get_default_dtype());
  std::vector<int64_t> shape;
  try {
    shape = at::infer_size(nu.sizes(), z.sizes());
  } catch (const c10::Error&) {
    TORCH_CHECK(false, op, ": nu (shape ", nu.sizes(), ") and z (shape ", z.sizes(),
                ") cannot be broadcast together");
  }
  return {nu.to(dt).expand(shape).contiguous(), z.to(dt).expand(shape).contiguous()};
}

}  // namespace vmfdist
