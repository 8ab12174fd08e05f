// The fixed-order chunk sum of the CPU reductions (the mean-field and Radial KLs): a chunk of
// values summed in double with 8 independent partial sums combined in a fixed order, so that a
// sum of chunk sums added in order (fill_total) does not depend on the thread count.  Host code only.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace vmfdist {

template <typename T>
double sum_chunk(const T* x, int64_t n) {
  double a[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) a[l] += static_cast<double>(x[i + l]);
  }
  for (int l = 0; i + l < n; ++l) a[l] += static_cast<double>(x[i + l]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// offset plus the chunk sums added in order, into the 0-dim `total`.
inline void fill_total(at::Tensor& total, const std::vector<double>& partial, double offset = 0.0) {
  double sum = 0.0;
  for (const double v : partial) sum += v;
  total.fill_(sum + offset);
}

}  // namespace vmfdist
