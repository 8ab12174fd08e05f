// CPU kernels of the fused radial noise (math and stream layout: vmfdist/radial.h).
// No temporaries of the output's size: pass 1 writes the normals into the output
// and sums their squares per chunk; pass 2 turns them into loc + scale eps coef in
// place.  The backward pass regenerates eps chunk by chunk.  Every parallel_for task
// runs through isa::dispatch (macros.h): the normals and the loops over a chunk are
// compiled for baseline x86-64 and for AVX2 + FMA, the copy chosen at run time.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "vmfdist/radial.h"
#include "host/radial_checks.h"
#include "host/random_state.h"

namespace vmfdist {
namespace {

using radial::kRadialChunk;

template <class scalar_t>
double sum_squares(const scalar_t* x, int64_t n) {
  double a[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double v = static_cast<double>(x[i + l]);
      a[l] += v * v;
    }
  }
  for (int l = 0; i + l < n; ++l) {
    const double v = static_cast<double>(x[i + l]);
    a[l] += v * v;
  }
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> radial_noise_cpu(const at::Tensor& loc_in, const at::Tensor& scale_in,
                                                                c10::SymInt num_samples_in, bool rowwise,
                                                                std::optional<at::Generator> generator,
                                                                std::optional<int64_t> seed_in,
                                                                std::optional<int64_t> offset_in) {
  const int64_t num_samples = num_samples_in.expect_int();
  const RadialLayout lay = check_radial_args(loc_in, scale_in, num_samples, rowwise);
  const SeedOffset so = cpu_seed_offset("radial_noise", generator, seed_in, offset_in, 2);
  at::Tensor seed_offset = cpu_seed_offset_tensor(so);
  const at::Tensor loc = loc_in.contiguous(), scale = scale_in.contiguous();
  auto [out, coef] = allocate_radial_outputs(loc, num_samples, lay, rowwise);
  const int64_t streams = num_samples * lay.groups;
  if (streams == 0 || lay.length == 0) return {out, coef, seed_offset};
  const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
  const int64_t units = streams * nchunk;
  std::vector<double> partial(static_cast<size_t>(units));
  double* pc = coef.mutable_data_ptr<double>();
  const uint64_t sd = so.seed, of = so.offset;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "radial_noise", [&] {
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    const scalar_t* pm = loc.const_data_ptr<scalar_t>();
    const scalar_t* ps = scale.const_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / kRadialChunk);
    // pass 1: normals into out, chunk sums of squares
    at::parallel_for(0, units, grain, [&](int64_t b, int64_t e) {
      isa::dispatch([&] {
        for (int64_t u = b; u < e; ++u) {
          const int64_t t = u / nchunk, c = u % nchunk;
          const int64_t start = c * kRadialChunk;
          const int64_t n = std::min(kRadialChunk, lay.length - start);
          scalar_t* dst = po + t * lay.length + start;  // (s, g) is contiguous: t * L
          fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(t), static_cast<uint32_t>(start / 4), n,
                                              dst);
          partial[static_cast<size_t>(u)] = sum_squares(dst, n);
        }
      });
    });
    // the factor of every group: chunk sums added in order
    at::parallel_for(0, streams, 256, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        double ss = 0.0;
        for (int64_t c = 0; c < nchunk; ++c) ss += partial[static_cast<size_t>(t * nchunk + c)];
        pc[t] = radial::group_coef(sd, of, static_cast<uint64_t>(t), ss);
      }
    });
    // pass 2: out = loc + scale * eps * coef, in double, rounded once
    at::parallel_for(0, units, grain, [&](int64_t b, int64_t e) {
      isa::dispatch([&] {
        for (int64_t u = b; u < e; ++u) {
          const int64_t t = u / nchunk, c = u % nchunk;
          const int64_t start = c * kRadialChunk;
          const int64_t n = std::min(kRadialChunk, lay.length - start);
          const int64_t g = t % lay.groups;
          scalar_t* dst = po + t * lay.length + start;
          const int64_t j0 = g * lay.length + start;  // position in the event
          const double k = pc[t];
          for (int64_t i = 0; i < n; ++i) {
            dst[i] = static_cast<scalar_t>(static_cast<double>(pm[j0 + i]) +
                                           static_cast<double>(ps[j0 + i]) * (static_cast<double>(dst[i]) * k));
          }
        }
      });
    });
  });
  return {out, coef, seed_offset};
}

at::Tensor radial_noise_scale_grad_cpu(const at::Tensor& grad_in, const at::Tensor& coef_in,
                                       const at::Tensor& seed_offset, bool rowwise) {
  constexpr const char* op = "radial_noise_scale_grad";
  const RadialLayout lay = check_radial_grad_args(grad_in, coef_in, rowwise);
  const SeedOffset so = read_seed_offset_cpu(op, seed_offset, 2);
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor coef = coef_in.to(at::kDouble).contiguous();
  const int64_t S = grad.size(0);
  at::Tensor out = at::empty(grad.sizes().slice(1), grad.options());
  const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
  const int64_t units = lay.groups * nchunk;
  if (units == 0) return out;
  const double* pc = coef.const_data_ptr<double>();
  const uint64_t sd = so.seed, of = so.offset;
  const int64_t event = lay.groups * lay.length;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "radial_noise_scale_grad", [&] {
    const scalar_t* pg = grad.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, units, 1, [&](int64_t b, int64_t e) {
      std::vector<scalar_t> eps(static_cast<size_t>(kRadialChunk));
      std::vector<double> acc(static_cast<size_t>(kRadialChunk));
      scalar_t* pe = eps.data();
      double* pa = acc.data();
      isa::dispatch([&] {
        for (int64_t u = b; u < e; ++u) {
          const int64_t g = u / nchunk, c = u % nchunk;
          const int64_t start = c * kRadialChunk;
          const int64_t n = std::min(kRadialChunk, lay.length - start);
          const int64_t j0 = g * lay.length + start;
          for (int64_t i = 0; i < n; ++i) pa[i] = 0.0;
          for (int64_t s = 0; s < S; ++s) {
            const int64_t t = s * lay.groups + g;
            fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(t), static_cast<uint32_t>(start / 4), n,
                                                pe);
            const double k = pc[t];
            const scalar_t* gs = pg + s * event + j0;
            for (int64_t i = 0; i < n; ++i) pa[i] += static_cast<double>(gs[i]) * (static_cast<double>(pe[i]) * k);
          }
          for (int64_t i = 0; i < n; ++i) po[j0 + i] = static_cast<scalar_t>(pa[i]);
        }
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("radial_noise", &radial_noise_cpu);
  m.impl("radial_noise_scale_grad", &radial_noise_scale_grad_cpu);
}

}  // namespace vmfdist
