// Host side of the fused radial noise, shared by the CPU and CUDA backends (torch
// headers; not for device code): the argument checks, the outputs and the operators
// themselves (radial::Ops), each backend supplying only its passes.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "host/meanfield_host.h"
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

// radial_sample: loc like rho; the prior both given or both absent.  Returns whether the KL is
// asked for.
inline bool check_radial_sample_args(const at::Tensor& loc, const at::Tensor& rho,
                                     const std::optional<at::Tensor>& prior_loc,
                                     const std::optional<at::Tensor>& prior_scale, int64_t num_samples) {
  constexpr const char* op = "radial_sample";
  meanfield::check_rho(op, rho);
  meanfield::check_like_rho(op, "loc", loc, rho);
  TORCH_CHECK(num_samples >= 0, op, ": num_samples must be non-negative, got ", num_samples);
  TORCH_CHECK(num_samples < philox::kMaxIndex, op, ": num_samples must be below 2^48, got ", num_samples);
  TORCH_CHECK(meanfield::given(prior_loc) == meanfield::given(prior_scale), op,
              ": pass both prior_loc and prior_scale, or neither");
  if (!meanfield::given(prior_loc)) return false;
  meanfield::check_prior(op, rho, *prior_loc, *prior_scale);
  return true;
}

// radial_sample_backward: grad (S, *rho.shape) like rho, coef (S,), noise absent or the kept eps
// (grad's shape and dtype); the KL's gradient needs the prior.  Returns whether grad_kl is given.
inline bool check_radial_sample_backward_args(const at::Tensor& grad, const at::Tensor& loc, const at::Tensor& rho,
                                              const at::Tensor& coef, const std::optional<at::Tensor>& noise,
                                              const std::optional<at::Tensor>& prior_loc,
                                              const std::optional<at::Tensor>& prior_scale,
                                              const std::optional<at::Tensor>& grad_kl) {
  constexpr const char* op = "radial_sample_backward";
  meanfield::check_rho(op, rho);
  meanfield::check_like_rho(op, "loc", loc, rho);
  TORCH_CHECK(grad.dim() == rho.dim() + 1 && grad.sizes().slice(1) == rho.sizes(), op,
              ": grad must have shape (num_samples, *rho.shape) = (S, ", rho.sizes(), "), got ", grad.sizes());
  TORCH_CHECK(grad.scalar_type() == rho.scalar_type() && grad.device() == rho.device(), op,
              ": grad must have rho's dtype and device");
  TORCH_CHECK(coef.dim() == 1 && coef.size(0) == grad.size(0) && coef.device() == grad.device(), op,
              ": coef must have shape (num_samples,) = (", grad.size(0), ",) on grad's device, got ", coef.sizes());
  if (meanfield::given(noise)) {
    TORCH_CHECK(noise->sizes() == grad.sizes() && noise->scalar_type() == grad.scalar_type() &&
                    noise->device() == grad.device(),
                op, ": noise must be radial_sample's kept eps (shape ", grad.sizes(), ", dtype ", grad.scalar_type(),
                "), got shape ", noise->sizes(), " and dtype ", noise->scalar_type());
  }
  if (!meanfield::given(grad_kl)) return false;
  TORCH_CHECK(meanfield::given(prior_loc) && meanfield::given(prior_scale), op,
              ": the KL's gradient needs prior_loc and prior_scale");
  meanfield::check_prior(op, rho, *prior_loc, *prior_scale);
  meanfield::check_grad_kl(op, *grad_kl, rho);
  return true;
}

// The operators of one backend.  Backend: the seed interface (CpuSeeds, CudaSeeds) and
//   noise(out, coef, noise, loc, scale, lay, seed)     fill out and coef, and the eps into noise when it is
//                                                      not empty; at least one stream and element
//   scale_grad(out, grad, coef, noise, lay, seed)      out = d(sum grad * sample)/d scale, the eps read from
//                                                      noise when it is defined; a non-empty event
//   sample(out, coef, noise, kl, x, kl_offset, seed)   radial_sample over a whole-tensor event of x.rho's
//                                                      size (non-empty): as noise with the scale
//                                                      softplus(x.rho), and with x's prior kl (0-dim,
//                                                      zero) = kl_offset + the sum of radial::kl_term
//                                                      (in double); S may be 0
//   sample_backward(g_loc, g_rho, grad, coef, noise, x, grad_kl, seed)
//                                                      g_rho = sigmoid(rho) sum_s grad[s] eps_s coef_s and,
//                                                      when g_loc is not empty, g_loc = sum_s grad[s], each
//                                                      plus grad_kl times the KL's derivatives with x's
//                                                      prior (S may be 0)
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

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample(
      const at::Tensor& loc, const at::Tensor& rho, const std::optional<at::Tensor>& prior_loc,
      const std::optional<at::Tensor>& prior_scale, c10::SymInt num_samples_in, bool save_noise, double kl_offset,
      std::optional<at::Generator> generator, std::optional<int64_t> seed, std::optional<int64_t> offset) {
    const int64_t S = num_samples_in.expect_int();
    const bool with_kl = check_radial_sample_args(loc, rho, prior_loc, prior_scale, S);
    const typename Backend::Guard guard(rho.device());
    const auto drawn = Backend::draw("radial_sample", generator, seed, offset, 2, rho.device());
    const meanfield::Operands x{loc.contiguous(), rho.contiguous(), meanfield::contiguous_or_undefined(prior_loc),
                                meanfield::contiguous_or_undefined(prior_scale)};
    const RadialLayout lay{1, x.rho.numel()};
    auto [out, coef] = allocate_radial_outputs(x.rho, S, lay, false);
    at::Tensor noise = save_noise ? at::empty_like(out) : at::empty({0}, out.options());
    at::Tensor kl = at::zeros({}, x.rho.options());
    if (lay.length > 0 && (S > 0 || with_kl)) Backend::sample(out, coef, noise, kl, x, kl_offset, drawn.seed);
    else if (with_kl) kl.fill_(kl_offset);
    return {out, coef, drawn.tensor(), noise, kl};
  }

  static std::tuple<at::Tensor, at::Tensor> sample_backward(
      const at::Tensor& grad, const at::Tensor& loc, const at::Tensor& rho, const at::Tensor& coef_in,
      const at::Tensor& seed_offset, const std::optional<at::Tensor>& noise,
      const std::optional<at::Tensor>& prior_loc, const std::optional<at::Tensor>& prior_scale,
      const std::optional<at::Tensor>& grad_kl, bool loc_grad) {
    constexpr const char* op = "radial_sample_backward";
    const bool with_kl =
        check_radial_sample_backward_args(grad, loc, rho, coef_in, noise, prior_loc, prior_scale, grad_kl);
    const typename Backend::Guard guard(rho.device());
    const auto so = Backend::read(op, seed_offset, 2, rho.device());
    const at::Tensor none;
    const meanfield::Operands x{loc.contiguous(), rho.contiguous(), with_kl ? prior_loc->contiguous() : none,
                                with_kl ? prior_scale->contiguous() : none};
    at::Tensor g_rho = at::empty_like(x.rho, at::MemoryFormat::Contiguous);
    at::Tensor g_loc =
        loc_grad ? at::empty_like(x.rho, at::MemoryFormat::Contiguous) : at::empty({0}, x.rho.options());
    if (x.rho.numel() > 0) {
      Backend::sample_backward(g_loc, g_rho, grad.contiguous(), coef_in.to(at::kDouble).contiguous(),
                               meanfield::contiguous_or_undefined(noise), x, with_kl ? *grad_kl : none, so);
    }
    return {g_loc, g_rho};
  }
};

}  // namespace radial
}  // namespace vmfdist
