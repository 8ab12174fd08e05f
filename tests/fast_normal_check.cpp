// A torch-free driver for csrc/include/vmfdist/fast_normal.h, compiled and run by
// tests/test_vmf.py: prints the normals [0, n) of stream (seed, offset, row) three times,
// from the vectorised batch routine normals_f32 run through isa::dispatch (the AVX2 + FMA
// copy where the CPU has both, as the extension runs it), from the same routine called
// directly (the baseline copy) and from the scalar normal4_f32 (what the CUDA kernel
// calls), as hexadecimal floats.  With a fifth argument nrows, the normals [0, n) of the
// streams row .. row + nrows - 1 from the multi-row routine normals_f32_rows (short vMF
// rows), the same three ways.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vmfdist/fast_normal.h"
#include "vmfdist/isa_dispatch.h"

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) return 2;
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const uint64_t offset = std::strtoull(argv[2], nullptr, 10);
  const uint64_t row = std::strtoull(argv[3], nullptr, 10);
  const int64_t n = std::strtoll(argv[4], nullptr, 10);
  if (argc == 6) {
    const int64_t nrows = std::strtoll(argv[5], nullptr, 10);
    const uint32_t nb = static_cast<uint32_t>((n + 3) / 4);
    const int64_t lanes = 4 * vmfdist::fast_normal::kLanes;
    std::vector<float> rows(((4 * nb * nrows + lanes - 1) / lanes) * lanes), base(rows.size());
    vmfdist::isa::dispatch([&] { vmfdist::fast_normal::normals_f32_rows(seed, offset, row, nrows, nb, rows.data()); });
    vmfdist::fast_normal::normals_f32_rows(seed, offset, row, nrows, nb, base.data());
    for (int64_t r = 0; r < nrows; ++r) {
      for (int64_t i = 0; i < n; i += 4) {
        float z[4];
        vmfdist::fast_normal::normal4_f32(seed, offset, row + r, static_cast<uint32_t>(i / 4), z);
        for (int64_t k = 0; k < 4 && i + k < n; ++k) {
          const int64_t j = 4 * nb * r + i + k;
          std::printf("%a %a %a\n", rows[j], base[j], z[k]);
        }
      }
    }
    return 0;
  }
  std::vector<float> batch(n), base(n);
  vmfdist::isa::dispatch([&] { vmfdist::fast_normal::normals_f32(seed, offset, row, 0, n, batch.data()); });
  vmfdist::fast_normal::normals_f32(seed, offset, row, 0, n, base.data());
  for (int64_t i = 0; i < n; i += 4) {
    float z[4];
    vmfdist::fast_normal::normal4_f32(seed, offset, row, static_cast<uint32_t>(i / 4), z);
    for (int64_t k = 0; k < 4 && i + k < n; ++k) std::printf("%a %a %a\n", batch[i + k], base[i + k], z[k]);
  }
  return 0;
}
