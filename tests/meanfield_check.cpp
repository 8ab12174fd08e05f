// A torch-free driver for csrc/include/vmfdist/meanfield.h, compiled and run by
// tests/test_meanfield.py: reads values x (one per line, decimal or hexadecimal floats)
// and prints, as hexadecimal floats, e^{-|x|} (exp_nonpos), softplus(x), sigmoid(x),
// log softplus(x) and sigmoid(x) / softplus(x), in float (the vectorisable polynomials:
// computed in an -O3 loop, as the CPU kernels do) and in double (libm).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vmfdist/meanfield.h"

namespace mf = vmfdist::meanfield;

template <typename T>
void run(const std::vector<double>& xs) {
  const size_t n = xs.size();
  std::vector<T> x(n), e(n), sp(n), sg(n), ls(n), ratio(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(xs[i]);
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
  for (size_t i = 0; i < n; ++i) {
    std::printf("%a %a %a %a %a %a\n", static_cast<double>(x[i]), static_cast<double>(e[i]),
                static_cast<double>(sp[i]), static_cast<double>(sg[i]), static_cast<double>(ls[i]),
                static_cast<double>(ratio[i]));
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
