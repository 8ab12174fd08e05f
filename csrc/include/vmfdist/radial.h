// Fused radial noise (Radial BNN posterior, Farquhar et al.): for each sample s,
//   out[s] = loc + scale * eps_s * (r_s / |eps_s|),   eps_s ~ N(0, I_D),  r_s ~ N(0, 1),
// with |eps_s| over the whole event (or over each row of the last dimension when
// `rowwise`; then every row has its own radius).  Shared by the CPU loops
// (csrc/cpu/radial_cpu.cpp) and the CUDA kernels (csrc/cuda/radial_cuda.cu).
//
// Randomness (part of the reproducibility contract): the event is split into G
// groups of length L (G = 1, L = D; or G = rows, L = row length).  Group g of
// sample s is "stream index" t = s G + g:
//   * its normals are those of the Philox stream (seed, offset, t), element k of the
//     group being normal k of that stream (block k / 4; fast_normal.h: float32
//     outputs use the float Box-Muller, other dtypes the double one);
//   * its radius is the first double Box-Muller normal of stream (seed, offset + 1, t).
// The sum of squares of a group is accumulated per chunk of kRadialChunk elements
// and the chunk sums are added in order, so the result does not depend on the
// thread count.  The backward pass regenerates eps from the same streams, or reads them
// from `noise` when the forward pass kept them (save_noise: same values, same bits).
#pragma once

#include <cstdint>

#include "vmfdist/fast_normal.h"
#include "vmfdist/macros.h"

namespace vmfdist {
namespace radial {

constexpr int64_t kRadialChunk = 4096;  // a multiple of 4: chunks start on Philox block boundaries

// r_t / sqrt(sum of squares): the factor every eps of group t is multiplied by.
VMF_INLINE double group_coef(uint64_t seed, uint64_t offset, uint64_t t, double sumsq) {
  double z[4];
  fast_normal::normal4_f64(seed, offset + 1, t, 0, z);
  return z[0] / ::sqrt(sumsq);
}

}  // namespace radial
}  // namespace vmfdist
