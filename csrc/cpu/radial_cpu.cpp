// CPU kernels of the fused radial noise (math and stream layout: vmfdist/radial.h).
// No temporaries of the output's size: pass 1 writes the normals into the output
// and sums their squares per chunk; pass 2 turns them into loc + scale eps coef in
// place (pass 1 also copies the normals into `noise` when the caller keeps them).  The backward
// pass reads the kept eps or regenerates them chunk by chunk.  The operators (checks,
// seed, outputs) are shared with CUDA: radial::Ops in host/radial_host.h.  Every
// parallel_for task runs through isa::dispatch (isa_dispatch.h): the normals and the loops
// over a chunk are compiled for baseline x86-64 and for AVX2 + FMA, the copy chosen at
// run time.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "vmfdist/isa_dispatch.h"
#include "vmfdist/radial.h"
#include "host/radial_host.h"
#include "host/random_state.h"

namespace vmfdist {
namespace {

using radial::kRadialChunk;
using radial::RadialLayout;

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

// f(u, t, start, n) for every chunk u in [0, units): the elements [start, start + n) of
// stream (or group) t = u / nchunk, each of whose `length` elements is cut in nchunk chunks.
// One parallel_for task at a time, through isa::dispatch.
template <class F>
void for_each_chunk(int64_t units, int64_t nchunk, int64_t length, int64_t grain, const F& f) {
  at::parallel_for(0, units, grain, [&](int64_t b, int64_t e) {
    isa::dispatch([&] {
      for (int64_t u = b; u < e; ++u) {
        const int64_t t = u / nchunk, start = (u % nchunk) * kRadialChunk;
        f(u, t, start, std::min(kRadialChunk, length - start));
      }
    });
  });
}

struct CpuRadial : CpuSeeds {
  static void noise(at::Tensor& out, at::Tensor& coef, at::Tensor& noise, const at::Tensor& loc,
                    const at::Tensor& scale, const RadialLayout& lay, const SeedOffset& so) {
    const int64_t streams = out.size(0) * lay.groups;
    const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
    const int64_t units = streams * nchunk;
    std::vector<double> partial(static_cast<size_t>(units));
    double* pc = coef.mutable_data_ptr<double>();
    const uint64_t sd = so.seed, of = so.offset;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loc.scalar_type(), "radial_noise", [&] {
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      scalar_t* pn = noise.numel() > 0 ? noise.mutable_data_ptr<scalar_t>() : nullptr;
      const scalar_t* pm = loc.const_data_ptr<scalar_t>();
      const scalar_t* ps = scale.const_data_ptr<scalar_t>();
      const int64_t grain = std::max<int64_t>(1, 65536 / kRadialChunk);
      // pass 1: normals into out, chunk sums of squares
      for_each_chunk(units, nchunk, lay.length, grain, [&](int64_t u, int64_t t, int64_t start, int64_t n) {
        scalar_t* dst = po + t * lay.length + start;  // (s, g) is contiguous: t * L
        fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(t), static_cast<uint32_t>(start / 4), n, dst);
        partial[static_cast<size_t>(u)] = sum_squares(dst, n);
        if (pn != nullptr) std::copy(dst, dst + n, pn + t * lay.length + start);  // kept for the backward
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
      for_each_chunk(units, nchunk, lay.length, grain, [&](int64_t, int64_t t, int64_t start, int64_t n) {
        scalar_t* dst = po + t * lay.length + start;
        const int64_t j0 = (t % lay.groups) * lay.length + start;  // position in the event
        const double k = pc[t];
        for (int64_t i = 0; i < n; ++i) {
          dst[i] = static_cast<scalar_t>(static_cast<double>(pm[j0 + i]) +
                                         static_cast<double>(ps[j0 + i]) * (static_cast<double>(dst[i]) * k));
        }
      });
    });
  }

  static void scale_grad(at::Tensor& out, const at::Tensor& grad, const at::Tensor& coef, const at::Tensor& noise,
                         const RadialLayout& lay, const SeedOffset& so) {
    const int64_t S = grad.size(0);
    const int64_t nchunk = (lay.length + kRadialChunk - 1) / kRadialChunk;
    const int64_t units = lay.groups * nchunk;
    const double* pc = coef.const_data_ptr<double>();
    const uint64_t sd = so.seed, of = so.offset;
    const int64_t event = lay.groups * lay.length;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "radial_noise_scale_grad", [&] {
      const scalar_t* pg = grad.const_data_ptr<scalar_t>();
      const scalar_t* pn = noise.defined() ? noise.const_data_ptr<scalar_t>() : nullptr;
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
              const scalar_t* es = pe;  // the eps of this chunk: kept by the forward pass, or regenerated
              if (pn != nullptr) {
                es = pn + s * event + j0;
              } else {
                fast_normal::fill_normals<scalar_t>(sd, of, static_cast<uint64_t>(t), static_cast<uint32_t>(start / 4),
                                                    n, pe);
              }
              const double k = pc[t];
              const scalar_t* gs = pg + s * event + j0;
              for (int64_t i = 0; i < n; ++i) pa[i] += static_cast<double>(gs[i]) * (static_cast<double>(es[i]) * k);
            }
            for (int64_t i = 0; i < n; ++i) po[j0 + i] = static_cast<scalar_t>(pa[i]);
          }
        });
      });
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("radial_noise", &radial::Ops<CpuRadial>::noise);
  m.impl("radial_noise_scale_grad", &radial::Ops<CpuRadial>::scale_grad);
}

}  // namespace vmfdist
