// Host side of the fused radial noise, shared by the CPU and CUDA backends (torch
// headers; not for device code): the argument checks, the outputs and the operators
// themselves (radial::Ops), each backend supplying only its passes.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "vmfdist/philox.h"

namespace vmfdist {
namespace radial {

// The event of the radial noise as `groups` rows of `length` elements.
struct RadialLayout {
  int64_t groups, length;
};

inline RadialLayout radial_layout(at::IntArrayRef shape, bool rowwise, const char* op) {
  int64_t numel = 1;
  for (const int64_t s : shape) numel *= s;
  if (!rowwise) return {1, numel};
  TORCH_CHECK(shape.size() >= 1, op, ": rowwise needs loc with at least one dimension");
  const int64_t len = shape.back();
  return {len == 0 ? 0 : numel / len, len};
}

// (The seed and offset are checked by check_random_args, random_state.h.)
inline RadialLayout check_radial_args(const at::Tensor& loc, const at::Tensor& scale, int64_t num_samples,
                                      bool rowwise) {
  constexpr const char* op = "radial_noise";
  TORCH_CHECK(at::isFloatingType(loc.scalar_type()), op, ": loc must be a floating tensor, got ", loc.scalar_type());
  TORCH_CHECK(loc.scalar_type() == scale.scalar_type(), op, ": loc and scale must have the same dtype, got ",
              loc.scalar_type(), " and ", scale.scalar_type());
  TORCH_CHECK(loc.sizes() == scale.sizes(), op, ": loc and scale must have the same shape, got ", loc.sizes(),
              " and ", scale.sizes());
  TORCH_CHECK(loc.device() == scale.device(), op, ": loc and scale must be on the same device");
  TORCH_CHECK(num_samples >= 0, op, ": num_samples must be non-negative, got ", num_samples);
  const RadialLayout lay = radial_layout(loc.sizes(), rowwise, op);
  TORCH_CHECK(lay.length < (int64_t(1) << 34), op, ": a group (the event, or a row) must have fewer than 2^34 elements");
  TORCH_CHECK(lay.groups == 0 || num_samples <= (philox::kMaxIndex - 1) / lay.groups, op,
              ": num_samples * groups must be below 2^48");
  return lay;
}

inline RadialLayout check_radial_grad_args(const at::Tensor& grad, const at::Tensor& coef, bool rowwise) {
  constexpr const char* op = "radial_noise_scale_grad";
  TORCH_CHECK(grad.dim() >= 1, op, ": grad must have a leading sample dimension");
  TORCH_CHECK(at::isFloatingType(grad.scalar_type()), op, ": grad must be a floating tensor");
  const RadialLayout lay = radial_layout(grad.sizes().slice(1), rowwise, op);
  if (rowwise) {
    TORCH_CHECK(coef.dim() == 2 && coef.size(0) == grad.size(0) && coef.size(1) == lay.groups, op,
                ": coef must have shape (num_samples, rows) = (", grad.size(0), ", ", lay.groups, "), got ",
                coef.sizes());
  } else {
    TORCH_CHECK(coef.dim() == 1 && coef.size(0) == grad.size(0), op, ": coef must have shape (num_samples,) = (",
                grad.size(0), ",), got ", coef.sizes());
  }
  TORCH_CHECK(coef.device() == grad.device(), op, ": grad and coef must be on the same device");
  return lay;
}

// The outputs of radial_noise: out (num_samples, *loc.shape) like loc, and coef
// (num_samples,) or (num_samples, rows) in float64.
inline std::pair<at::Tensor, at::Tensor> allocate_radial_outputs(const at::Tensor& loc, int64_t num_samples,
                                                                 const RadialLayout& lay, bool rowwise) {
  std::vector<int64_t> out_shape{num_samples};
  for (const int64_t s : loc.sizes()) out_shape.push_back(s);
  at::Tensor out = at::empty(out_shape, loc.options());
  at::Tensor coef = rowwise ? at::zeros({num_samples, lay.groups}, loc.options().dtype(at::kDouble))
                            : at::zeros({num_samples}, loc.options().dtype(at::kDouble));
  return {out, coef};
}

// The operators of one backend.  Backend: the seed interface (CpuSeeds, CudaSeeds) and
//   noise(out, coef, noise, loc, scale, lay, seed)     fill out and coef, and the eps into noise when it is
//                                                      not empty; at least one stream and element
//   scale_grad(out, grad, coef, noise, lay, seed)      out = d(sum grad * sample)/d scale, the eps read from
//                                                      noise when it is defined; a non-empty event
// (loc, scale, grad, noise contiguous; coef float64 and contiguous).
template <class Backend>
struct Ops {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> noise(
      const at::Tensor& loc_in, const at::Tensor& scale_in, c10::SymInt num_samples_in, bool rowwise, bool save_noise,
      std::optional<at::Generator> generator, std::optional<int64_t> seed, std::optional<int64_t> offset) {
    const int64_t num_samples = num_samples_in.expect_int();
    const RadialLayout lay = check_radial_args(loc_in, scale_in, num_samples, rowwise);
    const typename Backend::Guard guard(loc_in.device());
    const auto drawn = Backend::draw("radial_noise", generator, seed, offset, 2, loc_in.device());
    const at::Tensor loc = loc_in.contiguous(), scale = scale_in.contiguous();
    auto [out, coef] = allocate_radial_outputs(loc, num_samples, lay, rowwise);
    at::Tensor noise = save_noise ? at::empty_like(out) : at::empty({0}, out.options());
    if (num_samples * lay.groups > 0 && lay.length > 0) Backend::noise(out, coef, noise, loc, scale, lay, drawn.seed);
    return {out, coef, drawn.tensor(), noise};
  }

  static at::Tensor scale_grad(const at::Tensor& grad_in, const at::Tensor& coef_in, const at::Tensor& seed_offset,
                               bool rowwise, const std::optional<at::Tensor>& noise_in) {
    constexpr const char* op = "radial_noise_scale_grad";
    const RadialLayout lay = check_radial_grad_args(grad_in, coef_in, rowwise);
    at::Tensor noise;
    if (noise_in.has_value() && noise_in->defined()) {
      TORCH_CHECK(noise_in->sizes() == grad_in.sizes(), op, ": noise must have the shape of grad ", grad_in.sizes(),
                  ", got ", noise_in->sizes());
      TORCH_CHECK(noise_in->scalar_type() == grad_in.scalar_type(), op, ": noise must have grad's dtype ",
                  grad_in.scalar_type(), ", got ", noise_in->scalar_type());
      TORCH_CHECK(noise_in->device() == grad_in.device(), op, ": noise and grad must be on the same device");
      noise = noise_in->contiguous();
    }
    const typename Backend::Guard guard(grad_in.device());
    const auto so = Backend::read(op, seed_offset, 2, grad_in.device());
    const at::Tensor grad = grad_in.contiguous();
    const at::Tensor coef = coef_in.to(at::kDouble).contiguous();
    at::Tensor out = at::empty(grad.sizes().slice(1), grad.options());
    if (lay.groups * lay.length > 0) Backend::scale_grad(out, grad, coef, noise, lay, so);
    return out;
  }
};

}  // namespace radial
}  // namespace vmfdist
