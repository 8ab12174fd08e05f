// CPU kernels of the Kronecker-eigenbasis ops: the matrix products, the
// orchestration and the operators are shared with CUDA (host/kron_host.h); this file supplies the
// two fused elementwise passes as at::parallel_for loops over the math of
// vmfdist/kron.h.  The noise depends only on (seed, offset, row), so any thread
// count gives the same tensor.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>

#include "vmfdist/isa_dispatch.h"
#include "vmfdist/kron.h"
#include "host/kron_host.h"
#include "host/random_state.h"

namespace vmfdist {
namespace {

using kron::BatchOffsets;
using kron::PowMode;

constexpr int64_t kGrain = 32768;  // elements per task of the elementwise pass

// The two passes below run through isa::dispatch (isa_dispatch.h), once per parallel_for task.

// t *= s^p over [0, rows * in) in stretches that stay inside one batch entry.
template <PowMode M, typename scalar_t>
void scale_mul_range(scalar_t* t, const scalar_t* s, const BatchOffsets& offs, int64_t per_batch, int64_t begin,
                     int64_t end, double power) {
  using opmath_t = at::opmath_type<scalar_t>;
  const opmath_t p = static_cast<opmath_t>(power);
  int64_t i = begin;
  while (i < end) {
    const int64_t b = i / per_batch;
    const int64_t k = i - b * per_batch;
    const int64_t len = std::min(end - i, per_batch - k);
    kron::scale_mul_stretch<M, scalar_t, opmath_t>(t + i, s + offs(b) + k, len, p);
    i += len;
  }
}

// One noise row: z[0, in) = E * s^p.  float32 draws its normals with the
// vectorised float Box-Muller (the same values as kron::noise4).
template <PowMode M, typename scalar_t>
void noise_row(scalar_t* z, const scalar_t* s, int64_t in, uint64_t seed, uint64_t offset, uint64_t row,
               double power) {
  using opmath_t = at::opmath_type<scalar_t>;
  const opmath_t p = static_cast<opmath_t>(power);
  if constexpr (std::is_same_v<scalar_t, float>) {
    fast_normal::normals_f32(seed, offset, row, 0, in, z);
    for (int64_t j = 0; j < in; ++j) z[j] = z[j] * kron::spow<M>(s[j], p);
  } else {
    for (int64_t j = 0; j < in; j += 4) {
      opmath_t e[4];
      kron::noise4<scalar_t, opmath_t>(seed, offset, row, static_cast<uint32_t>(j >> 2), e);
      const int64_t lim = std::min<int64_t>(4, in - j);
      for (int64_t k = 0; k < lim; ++k) {
        z[j + k] = static_cast<scalar_t>(e[k] * kron::spow<M>(static_cast<opmath_t>(s[j + k]), p));
      }
    }
  }
}

struct CpuBackend : CpuSeeds {
  static void scale_mul(at::Tensor& t, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                        double power) {
    const int64_t per_batch = out * in;
    const int64_t n = t.numel();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "kron_eigen_matvec", [&] {
      scalar_t* pt = t.mutable_data_ptr<scalar_t>();
      const scalar_t* ps = s.const_data_ptr<scalar_t>();
      kron::dispatch_pow_mode(kron::pow_mode(power), [&]<PowMode M>() {
        at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
          isa::dispatch([&] { scale_mul_range<M, scalar_t>(pt, ps, offs, per_batch, begin, end, power); });
        });
      });
    });
  }

  // z's rows r = b * out + i (matrix b): stream key_of(b, r, i) = {seed, offset, row} each.
  template <class KeyOf>
  static void noise_rows(at::Tensor& z, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                         double power, KeyOf key_of) {
    const int64_t rows = z.numel() / in;
    const int64_t grain = std::max<int64_t>(1, 4096 / in);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, z.scalar_type(), "kron_eigen_noise", [&] {
      scalar_t* pz = z.mutable_data_ptr<scalar_t>();
      const scalar_t* ps = s.const_data_ptr<scalar_t>();
      kron::dispatch_pow_mode(kron::pow_mode(power), [&]<PowMode M>() {
        at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
          isa::dispatch([&] {
            for (int64_t r = begin; r < end; ++r) {
              const int64_t b = r / out, i = r - b * out;
              const auto [seed, offset, row] = key_of(b, r, i);
              noise_row<M, scalar_t>(pz + r * in, ps + offs(b) + i * in, in, seed, offset, row, power);
            }
          });
        });
      });
    });
  }

  // kron_eigen_noise: one stream (seed, offset), rows counted over the whole tensor.
  static void noise(at::Tensor& z, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                    const Seed& so, double power) {
    const uint64_t seed = so.seed, offset = so.offset;
    noise_rows(z, s, offs, out, in, power, [=](int64_t, int64_t r, int64_t) {
      return std::tuple<uint64_t, uint64_t, uint64_t>{seed, offset, static_cast<uint64_t>(r)};
    });
  }

  // kron_eigen_noise_keyed's values: seeds in [0, 2^63) (any int64 >= 0), offsets in [0, 2^48 - 1].
  static void check_keys(const char* op, const at::Tensor& keys) {
    const int64_t* p = keys.const_data_ptr<int64_t>();
    for (int64_t k = 0; k < keys.size(0); ++k) {
      TORCH_CHECK(p[2 * k] >= 0, op, ": seed_offsets[", k, "] holds the seed ", p[2 * k], ", outside [0, 2^63)");
      TORCH_CHECK(p[2 * k + 1] >= 0 && p[2 * k + 1] <= philox::kMaxOffset - 1, op, ": seed_offsets[", k,
                  "] holds the offset ", p[2 * k + 1], ", outside [0, 2^48 - 1]");
    }
  }

  // Matrix b's rows are its own stream (keys[b], row i): the same values as kron_eigen_noise of
  // that matrix alone.
  static void noise_keyed(at::Tensor& z, const at::Tensor& s, const BatchOffsets& offs, int64_t out, int64_t in,
                          const int64_t* keys, double power) {
    noise_rows(z, s, offs, out, in, power, [=](int64_t b, int64_t, int64_t i) {
      return std::tuple<uint64_t, uint64_t, uint64_t>{static_cast<uint64_t>(keys[2 * b]),
                                                      static_cast<uint64_t>(keys[2 * b + 1]),
                                                      static_cast<uint64_t>(i)};
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, CPU, m) {
  m.impl("kron_eigen_ngd", &kron::Ops<CpuBackend>::ngd);
  m.impl("kron_eigen_moments", &kron::Ops<CpuBackend>::moments);
  m.impl("kron_eigen_matvec", &kron::Ops<CpuBackend>::matvec);
  m.impl("kron_eigen_noise", &kron::Ops<CpuBackend>::noise);
  m.impl("kron_eigen_noise_keyed", &kron::Ops<CpuBackend>::noise_keyed);
  m.impl("kron_eigen_sample", &kron::Ops<CpuBackend>::sample);
}

}  // namespace vmfdist
