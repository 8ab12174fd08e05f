// Host side of the mean-field ops (math: vmfdist/meanfield.h), shared by the CPU and CUDA
// backends (torch headers; not for device code): the argument checks, the outputs and the
// operators themselves (meanfield::Ops), each backend supplying only its passes.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "vmfdist/philox.h"

namespace vmfdist {
namespace meanfield {

inline bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

inline at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return given(t) ? t->contiguous() : at::Tensor();
}

// x like rho: same shape, dtype and device.
inline void check_like_rho(const char* op, const char* name, const at::Tensor& x, const at::Tensor& rho) {
  TORCH_CHECK(x.scalar_type() == rho.scalar_type(), op, ": ", name, " and rho must have the same dtype, got ",
              x.scalar_type(), " and ", rho.scalar_type());
  TORCH_CHECK(x.sizes() == rho.sizes(), op, ": ", name, " and rho must have the same shape, got ", x.sizes(), " and ",
              rho.sizes());
  TORCH_CHECK(x.device() == rho.device(), op, ": ", name, " must be on the same device as rho, got ", x.device(),
              " and ", rho.device());
}

inline void check_rho(const char* op, const at::Tensor& rho) {
  TORCH_CHECK(at::isFloatingType(rho.scalar_type()), op, ": rho must be a floating tensor, got ", rho.scalar_type());
  TORCH_CHECK(rho.numel() < (int64_t(1) << 34), op,
              ": rho must have fewer than 2^34 elements (one Philox stream per sample), got ", rho.numel());
}

// The prior N(prior_loc, prior_scale^2): each a single element or rho's shape, of rho's dtype
// and device.
inline void check_prior(const char* op, const at::Tensor& rho, const at::Tensor& prior_loc,
                        const at::Tensor& prior_scale) {
  for (const auto& [name, p] : {std::pair<const char*, const at::Tensor*>{"prior_loc", &prior_loc},
                                std::pair<const char*, const at::Tensor*>{"prior_scale", &prior_scale}}) {
    TORCH_CHECK(p->scalar_type() == rho.scalar_type(), op, ": ", name, " must have rho's dtype ", rho.scalar_type(),
                ", got ", p->scalar_type());
    TORCH_CHECK(p->device() == rho.device(), op, ": ", name, " must be on the same device as rho, got ", p->device(),
                " and ", rho.device());
    TORCH_CHECK(p->numel() == 1 || p->sizes() == rho.sizes(), op, ": ", name,
                " must have a single element or rho's shape ", rho.sizes(), ", got ", p->sizes());
  }
}

inline void check_meanfield_kl_args(const char* op, const at::Tensor& loc, const at::Tensor& rho,
                                    const at::Tensor& prior_loc, const at::Tensor& prior_scale) {
  check_rho(op, rho);
  check_like_rho(op, "loc", loc, rho);
  check_prior(op, rho, prior_loc, prior_scale);
}

// The gradient of a summed KL: one element, on rho's device.
inline void check_grad_kl(const char* op, const at::Tensor& g, const at::Tensor& rho) {
  TORCH_CHECK(g.numel() == 1, op, ": the KL's gradient must have a single element, got shape ", g.sizes());
  TORCH_CHECK(g.device() == rho.device(), op, ": the KL's gradient must be on rho's device ", rho.device(), ", got ",
              g.device());
}

// meanfield_sample: loc (optional) like rho; the prior both given (with loc) or both absent.
// Returns whether the KL is asked for.
inline bool check_meanfield_sample_args(const std::optional<at::Tensor>& loc, const at::Tensor& rho,
                                        const std::optional<at::Tensor>& prior_loc,
                                        const std::optional<at::Tensor>& prior_scale, int64_t num_samples) {
  constexpr const char* op = "meanfield_sample";
  check_rho(op, rho);
  if (given(loc)) check_like_rho(op, "loc", *loc, rho);
  TORCH_CHECK(num_samples >= 0, op, ": num_samples must be non-negative, got ", num_samples);
  TORCH_CHECK(num_samples < philox::kMaxIndex, op, ": num_samples must be below 2^48, got ", num_samples);
  TORCH_CHECK(given(prior_loc) == given(prior_scale), op, ": pass both prior_loc and prior_scale, or neither");
  if (!given(prior_loc)) return false;
  TORCH_CHECK(given(loc), op, ": the KL (prior_loc, prior_scale) needs loc");
  check_prior(op, rho, *prior_loc, *prior_scale);
  return true;
}

// The dtype of kept normals: float for float32, half and bfloat16; double for float64.
inline at::ScalarType noise_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// meanfield_sample_backward: grad (S, *rho.shape); noise absent or the kept normals; for the
// KL's gradient (grad_kl given) loc and the prior.  Returns whether grad_kl is given.
inline bool check_meanfield_backward_args(const char* op, const at::Tensor& grad, const at::Tensor& rho,
                                          const std::optional<at::Tensor>& noise,
                                          const std::optional<at::Tensor>& loc,
                                          const std::optional<at::Tensor>& prior_loc,
                                          const std::optional<at::Tensor>& prior_scale,
                                          const std::optional<at::Tensor>& grad_kl, bool loc_grad) {
  check_rho(op, rho);
  TORCH_CHECK(grad.dim() == rho.dim() + 1 && grad.sizes().slice(1) == rho.sizes(), op,
              ": grad must have shape (num_samples, *rho.shape) = (S, ", rho.sizes(), "), got ", grad.sizes());
  TORCH_CHECK(grad.scalar_type() == rho.scalar_type() && grad.device() == rho.device(), op,
              ": grad must have rho's dtype and device");
  if (given(noise)) {
    const at::ScalarType nt = noise_dtype(rho.scalar_type());
    TORCH_CHECK(noise->sizes() == grad.sizes() && noise->scalar_type() == nt && noise->device() == grad.device(), op,
                ": noise must be meanfield_sample's kept normals (shape ", grad.sizes(), ", dtype ", nt,
                "), got shape ", noise->sizes(), " and dtype ", noise->scalar_type());
  }
  if (given(loc)) check_like_rho(op, "loc", *loc, rho);
  TORCH_CHECK(!loc_grad || given(loc), op, ": loc_grad needs loc");
  if (!given(grad_kl)) return false;
  TORCH_CHECK(given(loc) && given(prior_loc) && given(prior_scale), op,
              ": the KL's gradient needs loc, prior_loc and prior_scale");
  check_prior(op, rho, *prior_loc, *prior_scale);
  check_grad_kl(op, *grad_kl, rho);
  return true;
}

// The outputs of meanfield_sample: out (num_samples, *rho.shape) like rho, and the normals in
// noise_dtype when kept (else an empty tensor).
inline std::pair<at::Tensor, at::Tensor> allocate_meanfield_outputs(const at::Tensor& rho, int64_t num_samples,
                                                                   bool save_noise) {
  std::vector<int64_t> shape{num_samples};
  for (const int64_t s : rho.sizes()) shape.push_back(s);
  const auto nopt = rho.options().dtype(noise_dtype(rho.scalar_type()));
  return {at::empty(shape, rho.options()), save_noise ? at::empty(shape, nopt) : at::empty({0}, nopt)};
}

// The contiguous operands of a pass: loc (undefined where the pass does not read it), rho, and
// the prior N(prior_loc, prior_scale^2), each of its two a single element or rho's shape (both
// undefined without the KL).
struct Operands {
  at::Tensor loc, rho, prior_loc, prior_scale;
  bool with_kl() const { return prior_loc.defined(); }
};

// The operators of one backend.  Backend: the seed interface (CpuSeeds, host/random_state.h, or
// CudaSeeds) and its passes over a non-empty rho, the tensors contiguous:
//   sample(out, noise, kl, x, seed)     out (S, *rho.shape) = loc + softplus(rho) eps (softplus(rho)
//                                       eps without loc; S may be 0), noise = eps when it is not
//                                       empty, and, with x's prior, kl (0-dim, zero) = the summed KL
//   sample_backward(g_loc, g_rho, grad, noise, x, grad_kl, seed)
//                                       g_rho = sigmoid(rho) sum_s grad[s] eps_s and, when g_loc is
//                                       not empty, g_loc = sum_s grad[s] (S = grad.size(0) may be 0),
//                                       eps read from noise when it is defined, else regenerated;
//                                       with x's prior each plus grad_kl (one element, undefined
//                                       without the prior) times the KL's derivative
//   kl(kl, x)                           kl (0-dim, zero) = the summed KL
//   kl_backward(g_loc, g_rho, grad, x)  grad (one element) times the KL's derivatives
template <class Backend>
struct Ops {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample(
      const std::optional<at::Tensor>& loc, const at::Tensor& rho, const std::optional<at::Tensor>& prior_loc,
      const std::optional<at::Tensor>& prior_scale, c10::SymInt num_samples_in, bool save_noise,
      std::optional<at::Generator> generator, std::optional<int64_t> seed, std::optional<int64_t> offset) {
    const int64_t S = num_samples_in.expect_int();
    const bool with_kl = check_meanfield_sample_args(loc, rho, prior_loc, prior_scale, S);
    const typename Backend::Guard guard(rho.device());
    const auto drawn = Backend::draw("meanfield_sample", generator, seed, offset, 1, rho.device());
    const Operands x{contiguous_or_undefined(loc), rho.contiguous(), contiguous_or_undefined(prior_loc),
                     contiguous_or_undefined(prior_scale)};
    auto [out, noise] = allocate_meanfield_outputs(x.rho, S, save_noise);
    at::Tensor kl = at::zeros({}, x.rho.options());
    if (x.rho.numel() > 0 && (S > 0 || with_kl)) Backend::sample(out, noise, kl, x, drawn.seed);
    return {out, noise, kl, drawn.tensor()};
  }

  static std::tuple<at::Tensor, at::Tensor> sample_backward(
      const at::Tensor& grad, const at::Tensor& rho, const at::Tensor& seed_offset,
      const std::optional<at::Tensor>& noise, const std::optional<at::Tensor>& loc,
      const std::optional<at::Tensor>& prior_loc, const std::optional<at::Tensor>& prior_scale,
      const std::optional<at::Tensor>& grad_kl, bool loc_grad) {
    constexpr const char* op = "meanfield_sample_backward";
    const bool with_kl =
        check_meanfield_backward_args(op, grad, rho, noise, loc, prior_loc, prior_scale, grad_kl, loc_grad);
    const typename Backend::Guard guard(rho.device());
    const auto so = Backend::read(op, seed_offset, 1, rho.device());
    const at::Tensor none;
    const Operands x{with_kl ? loc->contiguous() : none, rho.contiguous(), with_kl ? prior_loc->contiguous() : none,
                     with_kl ? prior_scale->contiguous() : none};
    at::Tensor g_rho = at::empty_like(x.rho, at::MemoryFormat::Contiguous);
    at::Tensor g_loc =
        loc_grad ? at::empty_like(x.rho, at::MemoryFormat::Contiguous) : at::empty({0}, x.rho.options());
    if (x.rho.numel() > 0) {
      Backend::sample_backward(g_loc, g_rho, grad.contiguous(), contiguous_or_undefined(noise), x,
                               with_kl ? *grad_kl : none, so);
    }
    return {g_loc, g_rho};
  }

  static at::Tensor kl(const at::Tensor& loc, const at::Tensor& rho, const at::Tensor& prior_loc,
                       const at::Tensor& prior_scale) {
    check_meanfield_kl_args("meanfield_kl", loc, rho, prior_loc, prior_scale);
    const typename Backend::Guard guard(rho.device());
    const Operands x{loc.contiguous(), rho.contiguous(), prior_loc.contiguous(), prior_scale.contiguous()};
    at::Tensor out = at::zeros({}, x.rho.options());
    if (x.rho.numel() > 0) Backend::kl(out, x);
    return out;
  }

  static std::tuple<at::Tensor, at::Tensor> kl_backward(const at::Tensor& grad, const at::Tensor& loc,
                                                        const at::Tensor& rho, const at::Tensor& prior_loc,
                                                        const at::Tensor& prior_scale) {
    constexpr const char* op = "meanfield_kl_backward";
    check_meanfield_kl_args(op, loc, rho, prior_loc, prior_scale);
    check_grad_kl(op, grad, rho);
    const typename Backend::Guard guard(rho.device());
    const Operands x{loc.contiguous(), rho.contiguous(), prior_loc.contiguous(), prior_scale.contiguous()};
    at::Tensor g_loc = at::empty_like(x.rho, at::MemoryFormat::Contiguous);
    at::Tensor g_rho = at::empty_like(x.rho, at::MemoryFormat::Contiguous);
    if (x.rho.numel() > 0) Backend::kl_backward(g_loc, g_rho, grad, x);
    return {g_loc, g_rho};
  }
};

}  // namespace meanfield
}  // namespace vmfdist
