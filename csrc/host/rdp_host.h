// Host side of the RDP grouping KL (rdp_kl), shared by the CPU and CUDA backends (torch headers;
// not for device code): the argument checks, the outputs and the operator (rdp::Ops), each
// backend supplying only its pass.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "host/tensor_checks.h"

namespace vmfdist {
namespace rdp {

// The inputs of rdp_kl, contiguous: log_kappa, prior_kappa, tau_local, tau_global 0-dim; local
// (4, G); glob (4,).
struct Operands {
  at::Tensor log_kappa, local, glob, prior_kappa, tau_local, tau_global;
  int64_t groups() const { return local.size(1); }
};

inline void check_rdp_kl_args(const at::Tensor& log_kappa, const at::Tensor& local, const at::Tensor& glob,
                              const at::Tensor& prior_kappa, const at::Tensor& tau_local,
                              const at::Tensor& tau_global, int64_t dim) {
  constexpr const char* op = "rdp_kl";
  TORCH_CHECK(at::isFloatingType(local.scalar_type()), op, ": local must be a floating tensor, got ",
              local.scalar_type());
  const std::pair<const char*, const at::Tensor*> scalars[] = {
      {"log_kappa", &log_kappa}, {"prior_kappa", &prior_kappa}, {"tau_local", &tau_local}, {"tau_global", &tau_global}};
  TORCH_CHECK(glob.scalar_type() == local.scalar_type(), op, ": glob must have local's dtype ", local.scalar_type(),
              ", got ", glob.scalar_type());
  for (const auto& [name, t] : scalars) {
    TORCH_CHECK(t->scalar_type() == local.scalar_type(), op, ": ", name, " must have local's dtype ",
                local.scalar_type(), ", got ", t->scalar_type());
  }
  check_same_device(op, {{"local", local}, {"log_kappa", log_kappa}, {"glob", glob}, {"prior_kappa", prior_kappa},
                         {"tau_local", tau_local}, {"tau_global", tau_global}});
  TORCH_CHECK(local.dim() == 2 && local.size(0) == 4, op,
              ": local must have shape (4, groups) (rows m_a, m_b, rho_a, rho_b), got ", local.sizes());
  TORCH_CHECK(glob.dim() == 1 && glob.size(0) == 4, op, ": glob must have shape (4,), got ", glob.sizes());
  for (const auto& [name, t] : scalars) {
    TORCH_CHECK(t->dim() == 0, op, ": ", name, " must be a 0-dim tensor, got shape ", t->sizes());
  }
  TORCH_CHECK(dim >= 2, op, ": dim (the groups' dimension) must be at least 2, got ", dim);
}

// The operator of one backend.  Backend: Guard(device) and
//   kl(kl, g_log_kappa, g_local, g_glob, x, dim, uniform)
//       kl and g_log_kappa (0-dim), g_local (4, G) and g_glob (4,) like x.local: the grouping's KL
//       (include/vmfdist/rdp.h, in double, the sum over the G + 1 radius factors in an order fixed
//       by G alone) and its derivatives in log_kappa, local and glob; G may be 0.
template <class Backend>
struct Ops {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kl(
      const at::Tensor& log_kappa, const at::Tensor& local, const at::Tensor& glob, const at::Tensor& prior_kappa,
      const at::Tensor& tau_local, const at::Tensor& tau_global, int64_t dim, bool uniform) {
    check_rdp_kl_args(log_kappa, local, glob, prior_kappa, tau_local, tau_global, dim);
    const typename Backend::Guard guard(local.device());
    const Operands x{log_kappa.contiguous(), local.contiguous(), glob.contiguous(), prior_kappa.contiguous(),
                     tau_local.contiguous(), tau_global.contiguous()};
    at::Tensor kl = at::empty({}, x.local.options());
    at::Tensor g_log_kappa = at::empty({}, x.local.options());
    at::Tensor g_local = at::empty_like(x.local);
    at::Tensor g_glob = at::empty_like(x.glob);
    Backend::kl(kl, g_log_kappa, g_local, g_glob, x, dim, uniform);
    return {kl, g_log_kappa, g_local, g_glob};
  }
};

}  // namespace rdp
}  // namespace vmfdist
