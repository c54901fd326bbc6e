// Causal multi-head self-attention on CUDA, forward and backward, from the fused qkv
// activation [B,T,3C] (q | k | v; head h uses channels [h*hs, (h+1)*hs), hs = C/NH): the
// simple kernels (KernelChoice::naive_attention; the default path is cuBLAS on tensor cores,
// gpt2_cuda_attention_gemm.cu).
//
// Forward, per (b, h) and query row t (one warp per row), with scale σ = 1/sqrt(hs):
//   s_j = σ q_t·k_j (j <= t),  m = max_j s_j,  l = Σ_j exp(s_j - m),  P_tj = exp(s_j - m)/l
//   out_t = Σ_j P_tj v_j,      saved: L_t = m + log l  (the row's log-sum-exp)
// Backward (the probabilities are recomputed as P_tj = exp(s_j - L_t); nothing [T,T] is kept):
//   dP_tj = dout_t·v_j,  D_t = Σ_j P_tj dP_tj (= dout_t·out_t),  dS_tj = P_tj (dP_tj - D_t)
//   dq_t = σ Σ_{j<=t} dS_tj k_j                    (row pass: one warp per query row t)
//   dk_j = σ Σ_{t>=j} dS_tj q_t,  dv_j = Σ_{t>=j} P_tj dout_t   (column pass: one warp per key j)
// The row pass stores D_t in the second half of `stats` for the column pass. Each gradient
// element is produced by exactly one thread as a sum in ascending index order: no atomics,
// deterministic.
//
// Work split inside a warp: for the scores, lanes take different keys (rows) and each computes
// a whole dot product from fp32 copies in shared memory; for the weighted sums, lanes take
// different channels and loop over the rows in order (coalesced reads). Shared memory per warp:
// the query (and dout) row in fp32 plus one or two rows of T floats. This is the simple,
// correct formulation; a tiled (flash-attention) kernel is the next step for speed.
//
// Test: ctest --test-dir build/cuda -R gpt2_cuda_ops   (needs a GPU; skips without one)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "model/cuda/gpt2_cuda_vec.cuh"

namespace strata::model::cuda_ops {
namespace {

constexpr int kMaxWarpsPerBlock = 4;

__device__ __forceinline__ float ToF(Bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ Bf16 ToB(float x) { return __float2bfloat16_rn(x); }

struct Shape {
  int B, T, C, NH, hs;
  float scale;
  bool vec;  // rows may be read 16 bytes at a time (see Dot)
  // Offsets into qkv [B,T,3C] of row (b, t), head h.
  __device__ size_t Q(int b, int t, int h) const { return (size_t(b) * T + t) * 3 * C + h * hs; }
  __device__ size_t K(int b, int t, int h) const { return Q(b, t, h) + C; }
  __device__ size_t V(int b, int t, int h) const { return Q(b, t, h) + 2 * size_t(C); }
  // Offset into [B,T,C] (out, dout) of row (b, t), head h.
  __device__ size_t O(int b, int t, int h) const { return (size_t(b) * T + t) * C + h * hs; }
};

// Decodes a warp's global index into (b, h, t) with rows ordered [B, NH, T] (the stats layout).
struct RowIndex {
  int64_t row;
  int b, h, t;
};
__device__ __forceinline__ bool WarpRow(const Shape& s, RowIndex* r) {
  r->row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r->row >= int64_t(s.B) * s.NH * s.T) return false;
  r->t = static_cast<int>(r->row % s.T);
  const int64_t bh = r->row / s.T;
  r->h = static_cast<int>(bh % s.NH);
  r->b = static_cast<int>(bh / s.NH);
  return true;
}

// a (fp32, shared memory) · b (bf16, one row in global memory), summed in index order. With
// `vec` (n % 8 == 0 and b 16-byte aligned) b is read 16 bytes at a time: each lane reads its
// own row, so wide loads cut the number of (uncoalesced) load instructions by 8. Both paths
// add in the same order and give the same bits.
__device__ __forceinline__ float Dot(const float* a, const Bf16* b, int n, bool vec) {
  float acc = 0.0f;
  if (vec) {
    const uint4* b8 = reinterpret_cast<const uint4*>(b);
    for (int i = 0; i < n / 8; ++i) {
      const uint4 raw = b8[i];
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(pairs[k]);
        acc += a[8 * i + 2 * k] * f.x;
        acc += a[8 * i + 2 * k + 1] * f.y;
      }
    }
    return acc;
  }
  for (int d = 0; d < n; ++d) acc += a[d] * ToF(b[d]);
  return acc;
}

// Shared memory per warp: q[hs] then p[T].
__global__ void AttentionForwardKernel(Bf16* out, float* lse, const Bf16* qkv, Shape s) {
  extern __shared__ float smem[];
  RowIndex r;
  if (!WarpRow(s, &r)) return;
  const int lane = threadIdx.x % 32;
  float* q = smem + (threadIdx.x / 32) * (s.hs + s.T);
  float* p = q + s.hs;
  const Bf16* qrow = qkv + s.Q(r.b, r.t, r.h);
  for (int d = lane; d < s.hs; d += 32) q[d] = ToF(qrow[d]) * s.scale;
  __syncwarp();
  float mx = -INFINITY;
  for (int j = lane; j <= r.t; j += 32) {
    const float sj = Dot(q, qkv + s.K(r.b, j, r.h), s.hs, s.vec);
    p[j] = sj;
    mx = fmaxf(mx, sj);
  }
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int j = lane; j <= r.t; j += 32) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = WarpSum(sum);
  __syncwarp();  // p[] written by other lanes is read below
  const float inv = 1.0f / sum;
  const Bf16* v0 = qkv + s.V(r.b, 0, r.h);
  const size_t row_stride = 3 * size_t(s.C);
  Bf16* o = out + s.O(r.b, r.t, r.h);
  for (int d = lane; d < s.hs; d += 32) {
    float acc = 0.0f;
    for (int j = 0; j <= r.t; ++j) acc += p[j] * ToF(v0[j * row_stride + d]);
    o[d] = ToB(acc * inv);
  }
  if (lane == 0) lse[r.row] = mx + logf(sum);
}

// Row pass. Shared memory per warp: q[hs] (scaled), g[hs] (dout row), p[T], dp[T].
__global__ void AttentionBackwardQueryKernel(Bf16* dqkv, float* delta, const Bf16* dout,
                                             const Bf16* qkv, const float* lse, Shape s) {
  extern __shared__ float smem[];
  RowIndex r;
  if (!WarpRow(s, &r)) return;
  const int lane = threadIdx.x % 32;
  float* q = smem + (threadIdx.x / 32) * (2 * s.hs + 2 * s.T);
  float* g = q + s.hs;
  float* p = g + s.hs;
  float* dp = p + s.T;
  const Bf16* qrow = qkv + s.Q(r.b, r.t, r.h);
  const Bf16* grow = dout + s.O(r.b, r.t, r.h);
  for (int d = lane; d < s.hs; d += 32) {
    q[d] = ToF(qrow[d]) * s.scale;
    g[d] = ToF(grow[d]);
  }
  __syncwarp();
  const float L = lse[r.row];
  float dsum = 0.0f;
  for (int j = lane; j <= r.t; j += 32) {
    const float pj = expf(Dot(q, qkv + s.K(r.b, j, r.h), s.hs, s.vec) - L);
    const float dpj = Dot(g, qkv + s.V(r.b, j, r.h), s.hs, s.vec);
    p[j] = pj;
    dp[j] = dpj;
    dsum += pj * dpj;
  }
  const float D = WarpSum(dsum);
  __syncwarp();
  const Bf16* k0 = qkv + s.K(r.b, 0, r.h);
  const size_t row_stride = 3 * size_t(s.C);
  Bf16* dq = dqkv + s.Q(r.b, r.t, r.h);
  for (int d = lane; d < s.hs; d += 32) {
    float acc = 0.0f;
    for (int j = 0; j <= r.t; ++j) acc += p[j] * (dp[j] - D) * ToF(k0[j * row_stride + d]);
    dq[d] = ToB(ToF(dq[d]) + acc * s.scale);
  }
  if (lane == 0) delta[r.row] = D;
}

// Column pass: the warp's row index is the key j. Shared memory per warp: k[hs] (scaled),
// v[hs], p[T], ds[T] (indexed by the query row t >= j).
__global__ void AttentionBackwardKeyValueKernel(Bf16* dqkv, const Bf16* dout, const Bf16* qkv,
                                                const float* lse, const float* delta, Shape s) {
  extern __shared__ float smem[];
  RowIndex r;
  if (!WarpRow(s, &r)) return;
  const int lane = threadIdx.x % 32;
  const int j = r.t;
  float* k = smem + (threadIdx.x / 32) * (2 * s.hs + 2 * s.T);
  float* v = k + s.hs;
  float* p = v + s.hs;
  float* ds = p + s.T;
  const Bf16* krow = qkv + s.K(r.b, j, r.h);
  const Bf16* vrow = qkv + s.V(r.b, j, r.h);
  for (int d = lane; d < s.hs; d += 32) {
    k[d] = ToF(krow[d]) * s.scale;
    v[d] = ToF(vrow[d]);
  }
  __syncwarp();
  const int64_t stats_row0 = r.row - j;  // (b, h, t = 0)
  for (int t = j + lane; t < s.T; t += 32) {
    const float pt = expf(Dot(k, qkv + s.Q(r.b, t, r.h), s.hs, s.vec) - lse[stats_row0 + t]);
    const float dpt = Dot(v, dout + s.O(r.b, t, r.h), s.hs, s.vec);
    p[t] = pt;
    ds[t] = pt * (dpt - delta[stats_row0 + t]);
  }
  __syncwarp();
  const Bf16* q0 = qkv + s.Q(r.b, 0, r.h);
  const Bf16* g0 = dout + s.O(r.b, 0, r.h);
  const size_t qkv_stride = 3 * size_t(s.C);
  const size_t out_stride = size_t(s.C);
  Bf16* dk = dqkv + s.K(r.b, j, r.h);
  Bf16* dv = dqkv + s.V(r.b, j, r.h);
  for (int d = lane; d < s.hs; d += 32) {
    float acc_k = 0.0f, acc_v = 0.0f;
    for (int t = j; t < s.T; ++t) {
      acc_k += ds[t] * ToF(q0[t * qkv_stride + d]);
      acc_v += p[t] * ToF(g0[t * out_stride + d]);
    }
    dk[d] = ToB(ToF(dk[d]) + acc_k * s.scale);
    dv[d] = ToB(ToF(dv[d]) + acc_v);
  }
}

Result<Shape> MakeShape(const char* op, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C < 0 || NH <= 0 || C % NH != 0) {
    return Status::InvalidArgument(
        std::string(op) + ": need B, T, C >= 0, NH > 0 and C % NH == 0 (B=" + std::to_string(B) +
        " T=" + std::to_string(T) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + ")");
  }
  Shape s{B, T, C, NH, C / NH, 0.0f, false};
  s.scale = s.hs > 0 ? 1.0f / std::sqrt(static_cast<float>(s.hs)) : 0.0f;
  return s;
}

// Picks warps per block so that the block's shared memory fits the device's opt-in limit, and
// raises the kernel's dynamic shared memory limit when above the 48 KiB default.
template <typename Kernel>
Status Configure(const char* op, Kernel kernel, size_t bytes_per_warp, int* warps,
                 size_t* smem_bytes) {
  int dev = 0, optin = 0;
  STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&dev), "cudaGetDevice"));
  STRATA_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                 "cudaDeviceGetAttribute"));
  const size_t fit = bytes_per_warp == 0 ? kMaxWarpsPerBlock : size_t(optin) / bytes_per_warp;
  if (fit == 0) {
    return Status::InvalidArgument(
        std::string(op) + ": sequence too long for this kernel (" + std::to_string(bytes_per_warp) +
        " bytes of shared memory per row, device allows " + std::to_string(optin) + ")");
  }
  *warps = static_cast<int>(std::min<size_t>(fit, kMaxWarpsPerBlock));
  *smem_bytes = bytes_per_warp * *warps;
  if (*smem_bytes > 48 * 1024) {
    STRATA_RETURN_IF_ERROR(
        CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(*smem_bytes)),
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)"));
  }
  return Status::OK();
}

// Every row Dot reads starts on a 16-byte boundary: head offsets and row strides are multiples
// of 8 elements and the buffers are 16-byte aligned.
bool Aligned16(const Shape& s, const Bf16* qkv, const Bf16* dout) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return s.hs % 8 == 0 && s.C % 8 == 0 && aligned(qkv) && (dout == nullptr || aligned(dout));
}

unsigned Blocks(const Shape& s, int warps) {
  const int64_t rows = int64_t(s.B) * s.NH * s.T;
  return static_cast<unsigned>((rows + warps - 1) / warps);
}

}  // namespace

Status AttentionForwardNaive(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv,
                             int B, int T, int C, int NH) {
  STRATA_ASSIGN_OR_RETURN(Shape s, MakeShape("AttentionForward", B, T, C, NH));
  s.vec = Aligned16(s, qkv, nullptr);
  if (int64_t(B) * T * C == 0) return Status::OK();
  int warps = 0;
  size_t smem = 0;
  STRATA_RETURN_IF_ERROR(Configure("AttentionForward", AttentionForwardKernel,
                                   sizeof(float) * (size_t(s.hs) + T), &warps, &smem));
  AttentionForwardKernel<<<Blocks(s, warps), warps * 32, smem, ctx.stream()>>>(out, stats, qkv, s);
  return CudaStatus(cudaGetLastError(), "AttentionForwardKernel");
}

Status AttentionBackwardNaive(const CudaOpContext& ctx, Bf16* dqkv, const Bf16* dout,
                              const Bf16* qkv, float* stats, int B, int T, int C, int NH) {
  STRATA_ASSIGN_OR_RETURN(Shape s, MakeShape("AttentionBackward", B, T, C, NH));
  s.vec = Aligned16(s, qkv, dout);
  if (int64_t(B) * T * C == 0) return Status::OK();
  const float* lse = stats;
  float* delta = stats + size_t(B) * NH * T;
  const size_t per_warp = sizeof(float) * (2 * size_t(s.hs) + 2 * size_t(T));
  int warps = 0;
  size_t smem = 0;
  STRATA_RETURN_IF_ERROR(
      Configure("AttentionBackward", AttentionBackwardQueryKernel, per_warp, &warps, &smem));
  AttentionBackwardQueryKernel<<<Blocks(s, warps), warps * 32, smem, ctx.stream()>>>(
      dqkv, delta, dout, qkv, lse, s);
  STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "AttentionBackwardQueryKernel"));
  STRATA_RETURN_IF_ERROR(
      Configure("AttentionBackward", AttentionBackwardKeyValueKernel, per_warp, &warps, &smem));
  AttentionBackwardKeyValueKernel<<<Blocks(s, warps), warps * 32, smem, ctx.stream()>>>(
      dqkv, dout, qkv, lse, delta, s);
  return CudaStatus(cudaGetLastError(), "AttentionBackwardKeyValueKernel");
}

}  // namespace strata::model::cuda_ops
