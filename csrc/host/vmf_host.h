// Host side of the von Mises-Fisher sampler and its backward, shared by the CPU and CUDA
// backends (torch headers; not for device code): the argument checks and the operators
// (vmf::Ops), each backend supplying only its kernels.  The Python layer (vmfdist/distributions)
// validates user input with friendlier messages; these guard the raw ops.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <utility>

#include "vmfdist/philox.h"
#include "host/tensor_checks.h"
#include "vmfdist/vmf.h"

namespace vmfdist {
namespace vmf {

// vmf_sample(loc (B, d), concentration (B,), num_samples, ...); also the power spherical
// sampler's, which takes the same arguments (op names the operator in the messages).
// The seed and offset are checked by check_random_args (random_state.h).
inline void check_vmf_sample_args(const at::Tensor& loc, const at::Tensor& kappa, int64_t num_samples,
                                  const char* op = "vmf_sample") {
  TORCH_CHECK(loc.dim() == 2, op, ": loc must have shape (batch, d), got ", loc.sizes());
  TORCH_CHECK(loc.size(1) >= 2, op, ": the dimension d = loc.size(-1) must be at least 2, got ", loc.size(1));
  TORCH_CHECK(kappa.dim() == 1 && kappa.size(0) == loc.size(0), op,
              ": concentration must have shape (batch,) = (", loc.size(0), ",), got ", kappa.sizes());
  TORCH_CHECK(at::isFloatingType(loc.scalar_type()), op, ": loc must be a floating tensor, got ",
              loc.scalar_type());
  TORCH_CHECK(loc.scalar_type() == kappa.scalar_type(), op, ": loc and concentration must have the same dtype, got ",
              loc.scalar_type(), " and ", kappa.scalar_type());
  check_same_device(op, {{"loc", loc}, {"concentration", kappa}});
  TORCH_CHECK(num_samples >= 0, op, ": num_samples must be non-negative, got ", num_samples);
  TORCH_CHECK(loc.size(0) == 0 || num_samples <= (philox::kMaxIndex - 1) / loc.size(0), op,
              ": num_samples * batch must be below 2^48");
  TORCH_CHECK(loc.size(1) <= (int64_t(1) << 33), op, ": d must be below 2^33, got ", loc.size(1));
}

// vmf_sample_backward(grad_x (n, B, d), grad_one_minus_w (n, B) or None, loc (B, d),
// concentration (B,), x (n, B, d), one_minus_w (n, B), loc_grad, concentration_grad); also the
// power spherical sampler's backward, which takes the same arguments (op names the operator).
inline void check_vmf_backward_args(const at::Tensor& grad_x, const std::optional<at::Tensor>& grad_omw,
                                    const at::Tensor& loc, const at::Tensor& kappa, const at::Tensor& x,
                                    const at::Tensor& omw, const char* op = "vmf_sample_backward") {
  TORCH_CHECK(loc.dim() == 2 && loc.size(1) >= 2, op, ": loc must have shape (batch, d) with d >= 2, got ",
              loc.sizes());
  TORCH_CHECK(at::isFloatingType(loc.scalar_type()), op, ": loc must be a floating tensor, got ", loc.scalar_type());
  const int64_t B = loc.size(0), d = loc.size(1);
  TORCH_CHECK(kappa.dim() == 1 && kappa.size(0) == B, op, ": concentration must have shape (batch,) = (", B,
              ",), got ", kappa.sizes());
  TORCH_CHECK(x.dim() == 3 && x.size(1) == B && x.size(2) == d, op, ": x must have shape (num_samples, ", B, ", ", d,
              "), got ", x.sizes());
  const int64_t n = x.size(0);
  TORCH_CHECK(grad_x.sizes() == x.sizes(), op, ": grad_x must have the shape of x, ", x.sizes(), ", got ",
              grad_x.sizes());
  TORCH_CHECK(omw.dim() == 2 && omw.size(0) == n && omw.size(1) == B, op, ": one_minus_w must have shape (", n, ", ",
              B, "), got ", omw.sizes());
  if (grad_omw.has_value()) {
    TORCH_CHECK(grad_omw->sizes() == omw.sizes(), op, ": grad_one_minus_w must have the shape of one_minus_w, ",
                omw.sizes(), ", got ", grad_omw->sizes());
  }
  const auto dt = loc.scalar_type();
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"concentration", &kappa}, {"x", &x},
                                {"grad_x", &grad_x}, {"one_minus_w", &omw}}) {
    TORCH_CHECK(t->scalar_type() == dt, op, ": ", name, " must have loc's dtype ", dt, ", got ", t->scalar_type());
  }
  if (grad_omw.has_value()) {
    TORCH_CHECK(grad_omw->scalar_type() == dt, op, ": grad_one_minus_w must have loc's dtype ", dt, ", got ",
                grad_omw->scalar_type());
  }
  check_same_device(op, {{"loc", loc}, {"concentration", kappa}, {"x", x}, {"grad_x", grad_x}, {"one_minus_w", omw}});
  if (grad_omw.has_value()) check_same_device(op, {{"loc", loc}, {"grad_one_minus_w", *grad_omw}});
}

// The operators of one backend.  Backend: the seed interface (CpuSeeds, CudaSeeds) and
//   sample(x, omw, loc, kappa, seed)   fill x (n, B, d) and omw (n, B); loc, kappa contiguous, n * B > 0
// and the three passes of the backward (all tensors contiguous, B > 0, d >= 2; the
// float64 work tensors: frame (B, 3) = LocFrame (f, sgn, den) per batch row, rows (n, B, 3)
// = (a, q, gk) per sample row, gk = dL/dw * dw/dkappa, or 0 without concentration_grad):
//   frames(frame, loc)
//   rows(rows, grad_x, grad_omw or undefined, x, omw, loc, kappa, frame, concentration_grad)   n * B > 0
//   reduce(grad_loc or undefined, grad_kappa or undefined, rows, grad_x, x, loc, frame)
//       grad_loc = (I - mu mu^T) (sum over samples of the rows' mu-gradients) f, grad_kappa = sum gk
template <class Backend>
struct Ops {
  // (grad_loc (B, d) or an empty (0,) tensor without loc_grad, grad_concentration (B,) or (0,)).
  static std::tuple<at::Tensor, at::Tensor> sample_backward(const at::Tensor& grad_x_in,
                                                            const std::optional<at::Tensor>& grad_omw_in,
                                                            const at::Tensor& loc_in, const at::Tensor& kappa_in,
                                                            const at::Tensor& x_in, const at::Tensor& omw_in,
                                                            bool loc_grad, bool concentration_grad) {
    return sample_backward_as("vmf_sample_backward", grad_x_in, grad_omw_in, loc_in, kappa_in, x_in, omw_in,
                              loc_grad, concentration_grad);
  }

  // The same, for the operator op (the power spherical sampler's backward: another marginal).
  static std::tuple<at::Tensor, at::Tensor> sample_backward_as(const char* op, const at::Tensor& grad_x_in,
                                                               const std::optional<at::Tensor>& grad_omw_in,
                                                               const at::Tensor& loc_in, const at::Tensor& kappa_in,
                                                               const at::Tensor& x_in, const at::Tensor& omw_in,
                                                               bool loc_grad, bool concentration_grad) {
    check_vmf_backward_args(grad_x_in, grad_omw_in, loc_in, kappa_in, x_in, omw_in, op);
    const typename Backend::Guard guard(loc_in.device());
    const int64_t n = x_in.size(0), B = loc_in.size(0), d = loc_in.size(1);
    const auto opts = loc_in.options();
    at::Tensor grad_loc = loc_grad ? at::empty({B, d}, opts) : at::empty({0}, opts);
    at::Tensor grad_kappa = concentration_grad ? at::empty({B}, opts) : at::empty({0}, opts);
    if (!loc_grad && !concentration_grad) return {grad_loc, grad_kappa};
    if (B == 0) return {grad_loc, grad_kappa};
    if (n == 0) {
      grad_loc.zero_();
      grad_kappa.zero_();
      return {grad_loc, grad_kappa};
    }
    const at::Tensor loc = loc_in.contiguous(), kappa = kappa_in.contiguous(), x = x_in.contiguous();
    const at::Tensor grad_x = grad_x_in.contiguous(), omw = omw_in.contiguous();
    const at::Tensor grad_omw = grad_omw_in.has_value() ? grad_omw_in->contiguous() : at::Tensor();
    const auto dopts = opts.dtype(at::kDouble);
    at::Tensor frame = at::empty({B, 3}, dopts);
    at::Tensor rows = at::empty({n, B, 3}, dopts);
    Backend::frames(frame, loc);
    Backend::rows(rows, grad_x, grad_omw, x, omw, loc, kappa, frame, concentration_grad);
    Backend::reduce(loc_grad ? grad_loc : at::Tensor(), concentration_grad ? grad_kappa : at::Tensor(), rows, grad_x,
                    x, loc, frame);
    return {grad_loc, grad_kappa};
  }

  static std::tuple<at::Tensor, at::Tensor> sample(const at::Tensor& loc_in, const at::Tensor& kappa_in,
                                                   c10::SymInt num_samples_in, std::optional<at::Generator> generator,
                                                   std::optional<int64_t> seed, std::optional<int64_t> offset) {
    const int64_t num_samples = num_samples_in.expect_int();
    check_vmf_sample_args(loc_in, kappa_in, num_samples);
    const typename Backend::Guard guard(loc_in.device());
    const auto drawn = Backend::draw("vmf_sample", generator, seed, offset, 2, loc_in.device());
    const at::Tensor loc = loc_in.contiguous(), kappa = kappa_in.contiguous();
    at::Tensor x = at::empty({num_samples, loc.size(0), loc.size(1)}, loc.options());
    at::Tensor omw = at::empty({num_samples, loc.size(0)}, loc.options());
    if (num_samples * loc.size(0) > 0) Backend::sample(x, omw, loc, kappa, drawn.seed);
    return {x, omw};
  }
};

}  // namespace vmf
}  // namespace vmfdist
