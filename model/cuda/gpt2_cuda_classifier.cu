// The fused classifier: softmax cross-entropy's loss and its gradient w.r.t. the logits in one
// kernel per row, without the [N,V] probability tensor of SoftmaxCrossEntropyForward/Backward
// (which remain, behind KernelChoice::naive_classifier, chosen by the model). See
// FusedClassifier in gpt2_cuda_ops.h for the contract.
//
// One block per row. Pass 1 reads the row once, each thread keeping an online (max m, sum s of
// exp(z - m)) pair over its columns: z > m: s = s·exp(m - z) + 1, m = z; else s += exp(z - m).
// The pairs are combined in a fixed tree (warp butterflies, then one warp over the warps'
// results): (m1, s1) ∘ (m2, s2) = (M, s1·exp(m1 - M) + s2·exp(m2 - M)), M = max(m1, m2), so
// lse = M + log S. Pass 2 reads the row again (now mostly from L2) and overwrites it with
// dlogits. Each thread reads and writes the same columns, so the only cross-thread read, the
// target's logit, is taken before a barrier that precedes every write.
//
// Determinism: fixed reduction order, no atomics.
//
// Test: ctest --test-dir build/release -R gpt2_cuda_ops   (GpuOpsTest.FusedClassifier; GPU)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "model/cuda/gpt2_cuda_vec.cuh"

namespace strata::model::cuda_ops {
namespace {

constexpr int kThreads = 512;

// The running (max, sum of exp(z - max)) of a set of logits; m = -inf for the empty set.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float M = fmaxf(a.m, b.m);
  if (M == -INFINITY) return {M, 0.0f};  // both empty (exp(-inf - -inf) would be NaN)
  const float sa = a.m == -INFINITY ? 0.0f : a.s * expf(a.m - M);
  const float sb = b.m == -INFINITY ? 0.0f : b.s * expf(b.m - M);
  return {M, sa + sb};
}

__device__ __forceinline__ void Add(MaxSum* x, float z) {
  if (z > x->m) {
    x->s = x->s * expf(x->m - z) + 1.0f;  // exp(-inf) = 0 for the first value
    x->m = z;
  } else {
    x->s += expf(z - x->m);
  }
}

__device__ __forceinline__ MaxSum WarpCombine(MaxSum x) {
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum y{__shfl_xor_sync(kFullMask, x.m, o), __shfl_xor_sync(kFullMask, x.s, o)};
    x = Combine(x, y);
  }
  return x;
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
    FusedClassifierKernel(Bf16* logits, float* losses, const int32_t* targets, int V, int Vp,
                          float dloss) {
  __shared__ float warp_m[kThreads / 32], warp_s[kThreads / 32];
  __shared__ float row_lse;
  const int64_t row = blockIdx.x;
  Bf16* z = logits + row * Vp;
  const int chunks = Vp / kVec;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  MaxSum x{-INFINITY, 0.0f};
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const Bf16Vec<kVec> in = reinterpret_cast<const Bf16Vec<kVec>*>(z)[c];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (c * kVec + k < V) Add(&x, ToF(in.v[k]));
    }
  }
  x = WarpCombine(x);
  if (lane == 0) warp_m[warp] = x.m, warp_s[warp] = x.s;
  __syncthreads();
  if (warp == 0) {
    MaxSum y = lane < kThreads / 32 ? MaxSum{warp_m[lane], warp_s[lane]} : MaxSum{-INFINITY, 0.0f};
    y = WarpCombine(y);
    if (lane == 0) {
      const float lse = y.m + logf(y.s);
      const int target = targets[row];
      const float zt = (target >= 0 && target < V) ? ToF(z[target]) : NAN;
      losses[row] = lse - zt;
      row_lse = lse;
    }
  }
  __syncthreads();  // z[target] has been read; every thread may now overwrite its columns
  const float lse = row_lse;
  const int target = targets[row];
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    Bf16Vec<kVec> io = reinterpret_cast<const Bf16Vec<kVec>*>(z)[c];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int v = c * kVec + k;
      const float g =
          v < V ? (expf(ToF(io.v[k]) - lse) - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f;
      io.v[k] = ToB(g);
    }
    reinterpret_cast<Bf16Vec<kVec>*>(z)[c] = io;
  }
}

}  // namespace

Status FusedClassifier(const CudaOpContext& ctx, Bf16* logits, float* losses, float* mean_loss,
                       const int32_t* targets, int N, int V, int Vp, float dloss) {
  if (N < 0 || V <= 0 || Vp < V) {
    return Status::InvalidArgument(
        "FusedClassifier: need N >= 0 and 0 < V <= Vp (N=" + std::to_string(N) +
        " V=" + std::to_string(V) + " Vp=" + std::to_string(Vp) + ")");
  }
  if (N > 0) {
    const bool vec = Vp % 8 == 0 && Aligned16(logits);
    if (vec) {
      FusedClassifierKernel<8><<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(
          logits, losses, targets, V, Vp, dloss);
    } else {
      FusedClassifierKernel<1><<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(
          logits, losses, targets, V, Vp, dloss);
    }
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "FusedClassifierKernel"));
  }
  if (mean_loss != nullptr) return LaunchMeanLoss(ctx.stream(), mean_loss, losses, N);
  return Status::OK();
}

}  // namespace strata::model::cuda_ops
