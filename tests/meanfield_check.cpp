// A torch-free driver for csrc/include/vmfdist/meanfield.h, compiled and run by
// tests/test_meanfield.py: reads values x (one per line, decimal or hexadecimal floats)
// and prints, as hexadecimal floats, x and then e^{-|x|} (exp_nonpos), softplus(x),
// sigmoid(x), log softplus(x) and sigmoid(x) / softplus(x) twice: from the loop run
// through isa::dispatch (the AVX2 + FMA copy where the CPU has both, as the CPU kernels run
// it), then from the same loop called directly (the baseline copy).  In float these are the
// vectorisable polynomials (computed in an -O3 loop, as the CPU kernels do), in double libm.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "vmfdist/isa_dispatch.h"
#include "vmfdist/meanfield.h"

namespace mf = vmfdist::meanfield;

// The five functions of x[0, n) into out[5 n] (function k of x[i] at out[k n + i]).
template <typename T>
void functions(const T* x, size_t n, T* out) {
  T *e = out, *sp = out + n, *sg = out + 2 * n, *ls = out + 3 * n, *ratio = out + 4 * n;
  for (size_t i = 0; i < n; ++i) {
    const T a = x[i] < T(0) ? x[i] : -x[i];
    if constexpr (std::is_same_v<T, float>) {
      e[i] = mf::exp_nonpos(a);
    } else {
      e[i] = std::exp(a);
    }
    sp[i] = mf::softplus<T>(x[i]);
    sg[i] = mf::sigmoid<T>(x[i]);
    const mf::Scale<T> q = mf::scale_of<T>(x[i]);
    ls[i] = mf::log_sigma<T>(x[i], q);
    ratio[i] = mf::sigmoid_over_sigma<T>(x[i], q);
  }
}

template <typename T>
void run(const std::vector<double>& xs) {
  const size_t n = xs.size();
  std::vector<T> x(n), dispatched(5 * n), base(5 * n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(xs[i]);
  vmfdist::isa::dispatch([&] { functions<T>(x.data(), n, dispatched.data()); });
  functions<T>(x.data(), n, base.data());
  for (size_t i = 0; i < n; ++i) {
    std::printf("%a", static_cast<double>(x[i]));
    for (const std::vector<T>* v : {&dispatched, &base}) {
      for (size_t k = 0; k < 5; ++k) std::printf(" %a", static_cast<double>((*v)[k * n + i]));
    }
    std::printf("\n");
  }
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::vector<double> xs;
  char buf[128];
  while (std::fgets(buf, sizeof buf, stdin) != nullptr) xs.push_back(std::strtod(buf, nullptr));
  if (argv[1][0] == 'f') {
    run<float>(xs);
  } else {
    run<double>(xs);
  }
  return 0;
}
