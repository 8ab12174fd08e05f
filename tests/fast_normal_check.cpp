// A torch-free driver for csrc/include/vmfdist/fast_normal.h, compiled and run by
// tests/test_vmf.py: prints the normals [0, n) of stream (seed, offset, row) twice,
// from the vectorised batch routine normals_f32 and from the scalar normal4_f32
// (what the CUDA kernel calls), as hexadecimal floats.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vmfdist/fast_normal.h"

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const uint64_t offset = std::strtoull(argv[2], nullptr, 10);
  const uint64_t row = std::strtoull(argv[3], nullptr, 10);
  const int64_t n = std::strtoll(argv[4], nullptr, 10);
  std::vector<float> batch(n);
  vmfdist::fastnorm::normals_f32(seed, offset, row, 0, n, batch.data());
  for (int64_t i = 0; i < n; i += 4) {
    float z[4];
    vmfdist::fastnorm::normal4_f32(seed, offset, row, static_cast<uint32_t>(i / 4), z);
    for (int64_t k = 0; k < 4 && i + k < n; ++k) std::printf("%a %a\n", batch[i + k], z[k]);
  }
  return 0;
}
