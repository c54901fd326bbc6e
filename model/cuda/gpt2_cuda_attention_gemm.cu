// Causal multi-head self-attention on CUDA through cuBLAS strided-batched GEMMs on tensor
// cores, with fused causal-softmax kernels between them (the default; the warp-per-row kernels
// of gpt2_cuda_attention.cu remain behind KernelChoice::naive_attention). Same contract as
// AttentionForward/AttentionBackward in gpt2_cuda_ops.h.
//
// Per (b, h), with Q, K, V the head's [T,hs] rows and σ = 1/sqrt(hs):
//   forward:  S = σ Q Kᵀ (fp32)   P = causal softmax of S's rows (bf16; s > t: 0)
//             O = P V             saved: L_t = log Σ_{s<=t} exp(S_ts)   (stats, as the naive path)
//   backward: S = σ Q Kᵀ,  P = exp(S - L) (s <= t),   dV = Pᵀ dO,   dP = dO Vᵀ (fp32)
//             D_t = Σ_s P_ts dP_ts (stored in the second half of stats),
//             dS = P ∘ (dP - D) (bf16),   dQ = σ dS K,   dK = σ dSᵀ Q   (fp32, added into dqkv)
// The GEMMs compute the full T×T square (the masked half is zeroed by the softmax kernels): twice
// the causal FLOPs, on tensor cores. cuBLAS is column-major: a row-major [R,K] matrix is its
// column-major transpose, so S (row-major [T,T] = column-major Sᵀ) = K Qᵀ is
// gemm(T, N, m=T, n=T, k=hs, A=K, B=Q); the other products follow the same rule
// (gpt2_cuda_attention_plan.h, whose GEMM descriptions and head index math a CPU test checks).
//
// Layout: the heads are first copied out of the interleaved qkv [B,T,3,NH,hs] into head-major
// [B·NH, T, hs] buffers (q, k, v, dout), so that one strided batch covers many heads; the
// results are copied (forward) or added (backward, fp32 + bf16 rounded once) back. The copies
// move 16 bytes per thread when every row starts 16-byte aligned (hs % 8 == 0, C % 8 == 0 and
// aligned buffers), else one element.
//
// Memory: the op's workspace (CudaOpContext::Workspace) holds the head-major copies
// (4·N·C bf16 + 3·N·C fp32 in backward) and the T×T buffers of a batch of heads (6 bytes per
// score forward, 8 backward), with as many heads per batch as fit in
// KernelChoice::attention_batch_bytes (1 GiB; at least one): at GPT-2 small, T = 1024, B = 8, every
// one of the 96 heads in one batch, 768 MiB.
//
// Determinism: each softmax row is reduced by one warp in a fixed order; cuBLAS gives the same
// bits run to run on one GPU and toolkit; no atomics.
//
// Test: ctest --test-dir build/release -R gpt2_cuda_ops   (GpuOpsTest.Attention*; needs a GPU)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "model/cuda/gpt2_cuda_attention_plan.h"
#include "model/cuda/gpt2_cuda_carver.h"
#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "model/cuda/gpt2_cuda_vec.cuh"

namespace strata::model::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

using Dims = AttentionDims;

// Which way CopyHeadsKernel copies: kSplit, head-major dst [B·NH, T, hs] = the heads of src
// [B, T, stride] (head h at channel h·hs); kMerge, the reverse.
enum class HeadCopy { kSplit, kMerge };

template <HeadCopy kDir, int kVec>
__global__ void CopyHeadsKernel(Bf16* dst, const Bf16* src, int64_t stride, Dims d) {
  const int64_t total = d.BH() * d.T * (d.hs / kVec);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const HeadIndex x = LocateHead<kVec>(i, d, stride);
    const size_t to = kDir == HeadCopy::kSplit ? x.head_major : x.interleaved;
    const size_t from = kDir == HeadCopy::kSplit ? x.interleaved : x.head_major;
    *reinterpret_cast<Bf16Vec<kVec>*>(dst + to) =
        *reinterpret_cast<const Bf16Vec<kVec>*>(src + from);
  }
}

// dst [B, T, stride] += src [B·NH, T, hs] (fp32), each sum rounded to bf16 once.
template <int kVec>
__global__ void AddHeadsKernel(Bf16* dst, const float* src, int64_t stride, Dims d) {
  const int64_t total = d.BH() * d.T * (d.hs / kVec);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const HeadIndex x = LocateHead<kVec>(i, d, stride);
    const size_t head_major = x.head_major;
    Bf16Vec<kVec> out = *reinterpret_cast<const Bf16Vec<kVec>*>(dst + x.interleaved);
    const F32Vec<kVec> g = *reinterpret_cast<const F32Vec<kVec>*>(src + head_major);
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = ToB(ToF(out.v[k]) + g.v[k]);
    *reinterpret_cast<Bf16Vec<kVec>*>(dst + x.interleaved) = out;
  }
}

// Rows [0, rows) of S [rows, T]; row r is query t = r % T. One warp per row:
// P[r, s] = exp(S[r,s] - m) / l for s <= t, 0 beyond; lse[r] = m + log l.
__global__ void __launch_bounds__(kThreads)
    CausalSoftmaxKernel(Bf16* P, float* lse, const float* S, int T, int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;  // the whole warp: r depends on the warp only
  const int lane = threadIdx.x % 32;
  const int t = static_cast<int>(r % T);
  const float* s = S + r * T;
  Bf16* p = P + r * T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, s[j]);
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += 32) sum += expf(s[j] - mx);
  sum = WarpSum(sum);
  const float inv = 1.0f / sum;
  for (int j = lane; j < T; j += 32) p[j] = ToB(j <= t ? expf(s[j] - mx) * inv : 0.0f);
  if (lane == 0) lse[r] = mx + logf(sum);
}

// P[r, s] = exp(S[r, s] - lse[r]) for s <= t = r % T, 0 beyond (the forward's probabilities,
// recomputed from its log-sum-exps).
__global__ void CausalProbsKernel(Bf16* P, const float* S, const float* lse, int T, int64_t rows) {
  const int64_t total = rows * T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / T;
    const int s = static_cast<int>(i % T);
    P[i] = ToB(s <= static_cast<int>(r % T) ? expf(S[i] - lse[r]) : 0.0f);
  }
}

// One warp per row: D = Σ_{s<=t} P dP;  dS = P (dP - D) for s <= t, 0 beyond; delta[r] = D.
__global__ void __launch_bounds__(kThreads)
    CausalSoftmaxBackwardKernel(Bf16* dS, float* delta, const Bf16* P, const float* dP, int T,
                                int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int t = static_cast<int>(r % T);
  const Bf16* p = P + r * T;
  const float* dp = dP + r * T;
  Bf16* ds = dS + r * T;
  float acc = 0.0f;
  for (int j = lane; j <= t; j += 32) acc += ToF(p[j]) * dp[j];
  const float D = WarpSum(acc);
  for (int j = lane; j < T; j += 32) ds[j] = ToB(j <= t ? ToF(p[j]) * (dp[j] - D) : 0.0f);
  if (lane == 0) delta[r] = D;
}

Result<Dims> MakeDims(const char* op, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C < 0 || NH <= 0 || C % NH != 0) {
    return Status::InvalidArgument(
        std::string(op) + ": need B, T, C >= 0, NH > 0 and C % NH == 0 (B=" + std::to_string(B) +
        " T=" + std::to_string(T) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + ")");
  }
  return Dims{B, T, C, NH, C / NH};
}

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}
unsigned RowGrid(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

// The interleaved tensors' rows and heads start on 16-byte boundaries.
bool Vectorizable(const Dims& d, const void* a, const void* b) {
  return d.hs % 8 == 0 && d.C % 8 == 0 && Aligned16(a) && Aligned16(b);
}

template <HeadCopy kDir>
Status CopyHeads(const CudaOpContext& ctx, Bf16* dst, const Bf16* src, int64_t stride,
                 const Dims& d, bool vec) {
  const int64_t n = d.BH() * d.T * d.hs;
  if (vec) {
    CopyHeadsKernel<kDir, 8><<<GridFor(n / 8), kThreads, 0, ctx.stream()>>>(dst, src, stride, d);
  } else {
    CopyHeadsKernel<kDir, 1><<<GridFor(n), kThreads, 0, ctx.stream()>>>(dst, src, stride, d);
  }
  return CudaStatus(cudaGetLastError(), kDir == HeadCopy::kSplit ? "CopyHeadsKernel (split)"
                                                                 : "CopyHeadsKernel (merge)");
}
// dst [B·NH, T, hs] = the heads of src [B, T, stride].
Status SplitHeads(const CudaOpContext& ctx, Bf16* dst, const Bf16* src, int64_t stride,
                  const Dims& d, bool vec) {
  return CopyHeads<HeadCopy::kSplit>(ctx, dst, src, stride, d, vec);
}

// Heads per batch of T×T buffers taking `bytes_per_score` bytes per score.
int64_t HeadsPerBatch(const KernelChoice& kernels, const Dims& d, size_t bytes_per_score) {
  const size_t per_head = bytes_per_score * size_t(d.T) * size_t(d.T);
  const size_t budget = kernels.attention_batch_bytes;
  return std::max<int64_t>(1, std::min<int64_t>(d.BH(), int64_t(budget / per_head)));
}

template <typename Out>
cudaDataType_t CudaType();
template <>
cudaDataType_t CudaType<float>() {
  return CUDA_R_32F;
}
template <>
cudaDataType_t CudaType<Bf16>() {
  return CUDA_R_16BF;
}

// One StridedGemm (gpt2_cuda_attention_plan.h) through cublasGemmStridedBatchedEx: bf16 A and
// B, fp32 accumulation, C in Out.
template <typename Out>
Status RunGemm(const CudaOpContext& ctx, const StridedGemm<Bf16, Out>& g, const char* what) {
  const float beta = 0.0f;
  return CublasStatus(
      cublasGemmStridedBatchedEx(
          ctx.cublas(), g.ta, g.tb, g.m, g.n, g.k, &g.alpha, g.a, CUDA_R_16BF, g.lda, g.stride_a,
          g.b, CUDA_R_16BF, g.ldb, g.stride_b, &beta, g.c, CudaType<Out>(), g.ldc, g.stride_c,
          static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      what);
}

// The workspace pieces of one op (null pointers when `c` only counts). Bytes per score: 6
// forward (S fp32, P bf16), 8 backward (S, P, dS).
struct ForwardPieces {
  Bf16 *q, *k, *v, *o, *P;
  float* S;
};
ForwardPieces CarveForward(Carver& c, const Dims& d, int64_t heads) {
  const size_t nc = size_t(d.BH()) * d.T * d.hs, tt = size_t(d.T) * d.T;
  ForwardPieces x;
  x.q = c.Take<Bf16>(nc), x.k = c.Take<Bf16>(nc), x.v = c.Take<Bf16>(nc), x.o = c.Take<Bf16>(nc);
  x.S = c.Take<float>(heads * tt), x.P = c.Take<Bf16>(heads * tt);
  return x;
}
struct BackwardPieces {
  Bf16 *q, *k, *v, *dO, *P, *dS;
  float *dq, *dk, *dv, *S;
};
BackwardPieces CarveBackward(Carver& c, const Dims& d, int64_t heads) {
  const size_t nc = size_t(d.BH()) * d.T * d.hs, tt = size_t(d.T) * d.T;
  BackwardPieces x;
  x.q = c.Take<Bf16>(nc), x.k = c.Take<Bf16>(nc), x.v = c.Take<Bf16>(nc);
  x.dO = c.Take<Bf16>(nc);
  x.dq = c.Take<float>(nc), x.dk = c.Take<float>(nc), x.dv = c.Take<float>(nc);
  x.S = c.Take<float>(heads * tt);
  x.P = c.Take<Bf16>(heads * tt), x.dS = c.Take<Bf16>(heads * tt);
  return x;
}
constexpr size_t kForwardScoreBytes = sizeof(float) + sizeof(Bf16);
constexpr size_t kBackwardScoreBytes = sizeof(float) + 2 * sizeof(Bf16);

}  // namespace

size_t AttentionWorkspaceBytes(const KernelChoice& kernels, int sm, int B, int T, int C, int NH) {
  if (kernels.naive_attention || B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0) {
    return 0;
  }
  // Flash attention reads qkv in place: no head-major copies, no T×T buffers.
  if (kernels.flash_attention && FlashAttentionSupports(B, C, NH, sm)) return 0;
  const Dims d{B, T, C, NH, C / NH};
  // The larger of the two ops' (the forward's batches of heads can be the larger).
  Carver f(nullptr), b(nullptr);
  CarveForward(f, d, HeadsPerBatch(kernels, d, kForwardScoreBytes));
  CarveBackward(b, d, HeadsPerBatch(kernels, d, kBackwardScoreBytes));
  return std::max(f.used(), b.used());
}

Status AttentionForward(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv, int B,
                        int T, int C, int NH) {
  if (ctx.kernels().naive_attention) {
    return AttentionForwardNaive(ctx, out, stats, qkv, B, T, C, NH);
  }
  STRATA_ASSIGN_OR_RETURN(const Dims d, MakeDims("AttentionForward", B, T, C, NH));
  if (ctx.kernels().flash_attention && FlashAttentionSupports(B, C, NH, ctx.compute_capability())) {
    return FlashAttentionForward(ctx, out, stats, qkv, B, T, C, NH);
  }
  if (int64_t(B) * T * C == 0) return Status::OK();
  const int64_t heads = HeadsPerBatch(ctx.kernels(), d, kForwardScoreBytes);
  Carver sizer(nullptr);
  CarveForward(sizer, d, heads);
  STRATA_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(sizer.used()));
  Carver carver(ws);
  const ForwardPieces w = CarveForward(carver, d, heads);
  Bf16 *q = w.q, *k = w.k, *v = w.v, *o = w.o, *P = w.P;
  float* S = w.S;

  const bool vec = Vectorizable(d, qkv, out);
  const int64_t stride = 3 * int64_t(C);
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, q, qkv, stride, d, vec));
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, k, qkv + C, stride, d, vec));
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, v, qkv + 2 * size_t(C), stride, d, vec));
  const int hs = d.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t head_stride = int64_t(T) * hs;
  for (int64_t h0 = 0; h0 < d.BH(); h0 += heads) {
    const int64_t n = std::min(heads, d.BH() - h0);
    const size_t off = size_t(h0) * head_stride;
    STRATA_RETURN_IF_ERROR(RunGemm(ctx,
                                   ScoresGemm<Bf16, float>(T, hs, scale, q + off, k + off, S, n),
                                   "AttentionForward S=QK^T"));
    CausalSoftmaxKernel<<<RowGrid(n * T), kThreads, 0, ctx.stream()>>>(P, stats + h0 * T, S, T,
                                                                       n * T);
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "CausalSoftmaxKernel"));
    STRATA_RETURN_IF_ERROR(RunGemm(ctx, ValuesGemm<Bf16, Bf16>(T, hs, P, v + off, o + off, n),
                                   "AttentionForward O=PV"));
  }
  return CopyHeads<HeadCopy::kMerge>(ctx, out, o, C, d, vec);
}

Status AttentionBackward(const CudaOpContext& ctx, Bf16* dqkv, const Bf16* dout, const Bf16* qkv,
                         float* stats, int B, int T, int C, int NH) {
  if (ctx.kernels().naive_attention) {
    return AttentionBackwardNaive(ctx, dqkv, dout, qkv, stats, B, T, C, NH);
  }
  STRATA_ASSIGN_OR_RETURN(const Dims d, MakeDims("AttentionBackward", B, T, C, NH));
  if (ctx.kernels().flash_attention && FlashAttentionSupports(B, C, NH, ctx.compute_capability())) {
    return FlashAttentionBackward(ctx, dqkv, dout, qkv, stats, B, T, C, NH);
  }
  if (int64_t(B) * T * C == 0) return Status::OK();
  const int64_t heads = HeadsPerBatch(ctx.kernels(), d, kBackwardScoreBytes);
  Carver sizer(nullptr);
  CarveBackward(sizer, d, heads);
  STRATA_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(sizer.used()));
  Carver carver(ws);
  const BackwardPieces w = CarveBackward(carver, d, heads);

  const bool vec = Vectorizable(d, qkv, dqkv) && Aligned16(dout);
  const int64_t stride = 3 * int64_t(C);
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, w.q, qkv, stride, d, vec));
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, w.k, qkv + C, stride, d, vec));
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, w.v, qkv + 2 * size_t(C), stride, d, vec));
  STRATA_RETURN_IF_ERROR(SplitHeads(ctx, w.dO, dout, C, d, vec));
  const int hs = d.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t hstr = int64_t(T) * hs;  // one head's [T,hs] block
  const float* lse = stats;
  float* delta = stats + d.BH() * T;
  for (int64_t h0 = 0; h0 < d.BH(); h0 += heads) {
    const int64_t n = std::min(heads, d.BH() - h0);
    const size_t off = size_t(h0) * hstr;
    STRATA_RETURN_IF_ERROR(
        RunGemm(ctx, ScoresGemm<Bf16, float>(T, hs, scale, w.q + off, w.k + off, w.S, n),
                "AttentionBackward S=QK^T"));
    CausalProbsKernel<<<GridFor(n * T * T), kThreads, 0, ctx.stream()>>>(w.P, w.S, lse + h0 * T, T,
                                                                         n * T);
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "CausalProbsKernel"));
    STRATA_RETURN_IF_ERROR(
        RunGemm(ctx, ValueGradGemm<Bf16, float>(T, hs, w.P, w.dO + off, w.dv + off, n),
                "AttentionBackward dV=P^T dO"));
    STRATA_RETURN_IF_ERROR(RunGemm(ctx,
                                   ProbGradGemm<Bf16, float>(T, hs, w.dO + off, w.v + off, w.S, n),
                                   "AttentionBackward dP=dO V^T"));  // over S
    CausalSoftmaxBackwardKernel<<<RowGrid(n * T), kThreads, 0, ctx.stream()>>>(w.dS, delta + h0 * T,
                                                                               w.P, w.S, T, n * T);
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "CausalSoftmaxBackwardKernel"));
    STRATA_RETURN_IF_ERROR(
        RunGemm(ctx, QueryGradGemm<Bf16, float>(T, hs, scale, w.dS, w.k + off, w.dq + off, n),
                "AttentionBackward dQ=dS K"));
    STRATA_RETURN_IF_ERROR(
        RunGemm(ctx, KeyGradGemm<Bf16, float>(T, hs, scale, w.dS, w.q + off, w.dk + off, n),
                "AttentionBackward dK=dS^T Q"));
  }
  const int64_t n = d.BH() * T * hs;
  const float* grads[3] = {w.dq, w.dk, w.dv};
  for (int part = 0; part < 3; ++part) {
    Bf16* dst = dqkv + size_t(part) * C;
    if (vec) {
      AddHeadsKernel<8><<<GridFor(n / 8), kThreads, 0, ctx.stream()>>>(dst, grads[part], stride, d);
    } else {
      AddHeadsKernel<1><<<GridFor(n), kThreads, 0, ctx.stream()>>>(dst, grads[part], stride, d);
    }
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "AddHeadsKernel"));
  }
  return Status::OK();
}

}  // namespace strata::model::cuda_ops
