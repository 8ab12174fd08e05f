// A torch-free driver for csrc/include/vmfdist/philox.h, compiled and run by
// tests/test_philox.py (test_stream_*): prints a fixed sequence of draws from
// PhiloxStream(seed, offset, index) for comparison with the NumPy reference.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "vmfdist/philox.h"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const uint64_t offset = std::strtoull(argv[2], nullptr, 10);
  const uint64_t index = std::strtoull(argv[3], nullptr, 10);
  using vmfdist::philox::PhiloxStream;
  {  // 1. fourteen raw words (blocks 0..3)
    PhiloxStream s(seed, offset, index);
    for (int i = 0; i < 14; ++i) std::printf("u32 %" PRIu32 "\n", s.next_u32());
    std::printf("used %" PRIu64 "\n", s.words_used());
  }
  {  // 2. mixed draws (unaligned 64-bit draws, the cached normal, dropping it)
    PhiloxStream s(seed, offset, index);
    std::printf("u32 %" PRIu32 "\n", s.next_u32());
    std::printf("u64 %" PRIu64 "\n", s.next_u64());
    std::printf("f24 %.17g\n", s.next_uniform<24>());
    std::printf("f53 %.17g\n", s.next_uniform<53>());
    std::printf("n %.17g\n", s.next_normal());
    std::printf("n %.17g\n", s.next_normal());
    std::printf("n %.17g\n", s.next_normal());
    std::printf("u32 %" PRIu32 "\n", s.next_u32());
    std::printf("n %.17g\n", s.next_normal());
    std::printf("f11 %.17g\n", s.next_uniform<11>());
    std::printf("used %" PRIu64 "\n", s.words_used());
  }
  return 0;
}
