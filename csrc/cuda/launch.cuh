// Launch geometry shared by every CUDA kernel of the extension: the block size, the
// number of blocks for a given amount of work (capped, since every kernel loops with
// a grid stride), the stride loops themselves, a block's sum and the current stream.
//
//   kernel<<<launch::blocks_for(n), launch::kThreads, 0, launch::stream()>>>(...);
//   __global__ void kernel(...) { for (int64_t i : launch::grid_stride(n)) { ... } }
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

namespace vmfdist {
namespace launch {

// Threads per block of every kernel.
constexpr int kThreads = 256;
// Threads per warp (the vMF sampler gives each sample row one warp).
constexpr int kWarp = 32;
// At most this many blocks per multiprocessor; the stride loops cover any remainder.
constexpr int64_t kBlocksPerSM = 32;

// Blocks for `items` units of work of which one block takes `per_block` (one
// element per thread by default): at least 1, at most kBlocksPerSM per multiprocessor
// of the current device.
inline int blocks_for(int64_t items, int64_t per_block = kThreads) {
  const int64_t b = (items + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSM;
  return static_cast<int>(b < cap ? (b > 0 ? b : 1) : cap);
}

// The current CUDA stream of the current device (set by the caller's CUDAGuard).
inline cudaStream_t stream() { return at::cuda::getCurrentCUDAStream(); }

// start, start + step, ... below end, as a range for a range-based for loop.
struct StrideRange {
  struct Iterator {
    int64_t i, step;
    __device__ int64_t operator*() const { return i; }
    __device__ Iterator& operator++() {
      i += step;
      return *this;
    }
    // Only ever compared with the end iterator: "not past the end".
    __device__ bool operator!=(const Iterator& last) const { return i < last.i; }
  };
  int64_t start, stop, step;
  __device__ Iterator begin() const { return {start, step}; }
  __device__ Iterator end() const { return {stop, step}; }
};

// One index per thread of the grid: the thread's global index, then every
// blockDim.x * gridDim.x further.
__device__ inline StrideRange grid_stride(int64_t n) {
  return {blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, n,
          static_cast<int64_t>(blockDim.x) * gridDim.x};
}

// One index per block (all threads of a block see the same indices).
__device__ inline StrideRange block_stride(int64_t n) {
  return {static_cast<int64_t>(blockIdx.x), n, static_cast<int64_t>(gridDim.x)};
}

// One index per warp (all lanes of a warp see the same indices).
__device__ inline StrideRange warp_stride(int64_t n) {
  return {(blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp, n,
          (static_cast<int64_t>(gridDim.x) * blockDim.x) / kWarp};
}

// The sum of every thread's v over its block (of kThreads threads), returned to every thread:
// a tree in shared memory, added in a fixed order, so the bits do not depend on the launch.
// Every thread of the block calls it (it synchronises the block), as often as it likes.
__device__ inline double block_sum(double v) {
  __shared__ double red[kThreads];
  red[threadIdx.x] = v;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  const double total = red[0];
  __syncthreads();  // before the next call writes red
  return total;
}

}  // namespace launch
}  // namespace vmfdist
