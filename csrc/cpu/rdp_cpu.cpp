// CPU kernel of rdp_kl (the KL of one RDP grouping and its gradient, include/vmfdist/rdp.h): the
// G + 1 radius factors' terms and derivatives over at::parallel_for, their sum in a fixed order
// (chunk_sum_cpu.h: independent of the thread count), the directions' part on the calling thread.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "vmfdist/rdp.h"
#include "cpu/chunk_sum_cpu.h"
#include "host/random_state.h"
#include "host/rdp_host.h"

namespace vmfdist {
namespace {

struct CpuRdp : CpuSeeds {  // (for its Guard: rdp_kl draws nothing)
  static void kl(at::Tensor& kl, at::Tensor& g_log_kappa, at::Tensor& g_local, at::Tensor& g_glob,
                 const rdp::Operands& x, int64_t dim, bool uniform) {
    const int64_t G = x.groups();
    std::vector<double> terms(static_cast<size_t>(G + 1));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.local.scalar_type(), "rdp_kl", [&] {
      const auto scalar = [](const at::Tensor& t) { return static_cast<double>(t.const_data_ptr<scalar_t>()[0]); };
      const double tl = scalar(x.tau_local), tg = scalar(x.tau_global);
      const double beta_l = 1.0 / (tl * tl), beta_g = 1.0 / (tg * tg);
      const double log_beta_l = -2.0 * std::log(tl), log_beta_g = -2.0 * std::log(tg);
      const scalar_t* pl = x.local.const_data_ptr<scalar_t>();
      const scalar_t* pg = x.glob.const_data_ptr<scalar_t>();
      scalar_t* ol = g_local.mutable_data_ptr<scalar_t>();
      scalar_t* og = g_glob.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, G, 2048, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) terms[j] = rdp::radius_factor(pl + j, ol + j, G, beta_l, log_beta_l);
      });
      terms[G] = rdp::radius_factor(pg, og, 1, beta_g, log_beta_g);
      const rdp::Directions dirs = rdp::directions(scalar(x.log_kappa), scalar(x.prior_kappa),
                                                   static_cast<double>(dim), static_cast<double>(G), uniform);
      kl.fill_(sum_chunk(terms.data(), G + 1) + dirs.kl);
      g_log_kappa.fill_(dirs.g_log_kappa);
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) { m.impl("rdp_kl", &rdp::Ops<CpuRdp>::kl); }

}  // namespace vmfdist
