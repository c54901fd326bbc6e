// The token-embedding gradient without a scan of every token per vocabulary row:
//   dwte[v, c] += Σ_{n : tokens[n] = v} dout[n, c]
// (1) positions 0..N-1 are radix-sorted by token (cub::DeviceRadixSort::SortPairs, stable, all
// 32 key bits so that equal tokens are adjacent whatever their value); (2) one block per sorted
// index; the block at the start of a token's run sums that run's dout rows, in ascending
// position order (the sort is stable), into fp32 registers and adds them to the token's dwte
// row once. The block finds its run's end by a binary search of the sorted keys (a token that
// fills the batch, padding or end-of-text, is one run of N: a walk would be N dependent reads
// before any sum), and reads the run's rows four at a time ahead of the sums. Each dwte element is
// written by one thread, summing in the same order as the previous V-block kernel
// (KernelChoice::naive_embedding), so the two give the same bits; no atomics. Work: O(N log) for
// the sort plus one read of dout, instead of V blocks each reading all N tokens. Tokens outside [0,
// V) are skipped, as by the previous kernel.
//
// Test: ctest --test-dir build/release -R gpt2_cuda_ops   (GpuOpsTest.Embedding; needs a GPU)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "model/cuda/gpt2_cuda_vec.cuh"

namespace strata::model::cuda_ops {
namespace {

constexpr int kThreads = 128;
constexpr size_t kAlign = 256;

__global__ void IotaKernel(int32_t* out, int N) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
    out[i] = i;
  }
}

// The first index in [lo, N) whose key is greater than tok (keys sorted ascending, keys[lo] ==
// tok): O(log N) reads instead of a walk over the run.
__device__ int RunEnd(const int32_t* keys, int lo, int N, int32_t tok) {
  int hi = N;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (keys[mid] <= tok) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Block i handles the run of equal keys starting at sorted index i (and exits when i is not a
// run's start). Threads take kVec consecutive channels each.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
    SegmentSumKernel(float* dwte, const Bf16* dout, const int32_t* keys, const int32_t* pos, int N,
                     int C, int V) {
  const int i = blockIdx.x;
  const int32_t tok = keys[i];
  if (i > 0 && keys[i - 1] == tok) return;
  if (tok < 0 || tok >= V) return;
  __shared__ int run_end;
  if (threadIdx.x == 0) run_end = RunEnd(keys, i + 1, N, tok);
  __syncthreads();
  const int end = run_end;
  constexpr int kAhead = 4;  // rows loaded before they are summed (the sums stay in order)
  for (int c0 = threadIdx.x * kVec; c0 < C; c0 += kThreads * kVec) {
    float acc[kVec] = {};
    int j = i;
    for (; j + kAhead <= end; j += kAhead) {
      Bf16Vec<kVec> g[kAhead];
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
        g[a] = *reinterpret_cast<const Bf16Vec<kVec>*>(dout + size_t(pos[j + a]) * C + c0);
      }
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += __bfloat162float(g[a].v[k]);
      }
    }
    for (; j < end; ++j) {
      const Bf16Vec<kVec> g =
          *reinterpret_cast<const Bf16Vec<kVec>*>(dout + size_t(pos[j]) * C + c0);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += __bfloat162float(g.v[k]);
    }
    float* w = dwte + size_t(tok) * C + c0;
#pragma unroll
    for (int k = 0; k < kVec; ++k) w[k] += acc[k];
  }
}

size_t Aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t EmbeddingWorkspaceBytes(int N) {
  if (N <= 0) return 0;
  size_t sort_bytes = 0;
  if (cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr),
                                      static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), N, 0, 32) != cudaSuccess) {
    return 0;
  }
  return 3 * Aligned(sizeof(int32_t) * size_t(N)) + Aligned(sort_bytes);
}

Status EmbeddingBackwardWteSorted(const CudaOpContext& ctx, float* dwte, const Bf16* dout,
                                  const int32_t* tokens, int N, int C, int V) {
  if (N == 0 || C == 0 || V == 0) return Status::OK();
  size_t sort_bytes = 0;
  STRATA_RETURN_IF_ERROR(CudaStatus(
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens, static_cast<int32_t*>(nullptr),
                                      static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), N, 0, 32, ctx.stream()),
      "EmbeddingBackward: cub sort size"));
  const size_t ints = Aligned(sizeof(int32_t) * size_t(N));
  STRATA_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(3 * ints + Aligned(sort_bytes)));
  char* base = static_cast<char*>(ws);
  int32_t* pos_in = reinterpret_cast<int32_t*>(base);
  int32_t* keys = reinterpret_cast<int32_t*>(base + ints);
  int32_t* pos = reinterpret_cast<int32_t*>(base + 2 * ints);
  void* sort_tmp = base + 3 * ints;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((N + 255) / 256, 4096));
  IotaKernel<<<grid, 256, 0, ctx.stream()>>>(pos_in, N);
  STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "IotaKernel"));
  STRATA_RETURN_IF_ERROR(
      CudaStatus(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, tokens, keys, pos_in, pos, N,
                                                 0, 32, ctx.stream()),
                 "EmbeddingBackward: cub sort"));
  const bool vec = C % 8 == 0 && Aligned16(dout);
  if (vec) {
    SegmentSumKernel<8>
        <<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(dwte, dout, keys, pos, N, C, V);
  } else {
    SegmentSumKernel<1>
        <<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(dwte, dout, keys, pos, N, C, V);
  }
  return CudaStatus(cudaGetLastError(), "SegmentSumKernel");
}

}  // namespace strata::model::cuda_ops
