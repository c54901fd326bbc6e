// GPT-2's element-wise and row-wise kernels on CUDA: embeddings, LayerNorm, GELU, residual,
// bias broadcast/gradient, softmax cross-entropy, fp32<->bf16 conversion. bf16 in memory,
// fp32 arithmetic. (Attention is in gpt2_cuda_attention.cu, matrix products in
// gpt2_cuda_matmul.cc.)
//
// What each kernel computes (n indexes the N = B*T token rows, c the C channels):
//   EmbeddingForward   out[b,t,c] = wte[tok[b,t], c] + wpe[t, c]
//   EmbeddingBackward  dwte[v,c] += Σ_{n: tok[n]=v} dout[n,c]   (by default a sort by token
//                      and a segmented sum, gpt2_cuda_embedding.cu; the naive kernel here: one
//                      block per vocabulary row gathers its positions in ascending order. Both
//                      without atomics, with the same bits);
//                      dwpe[t,c] += Σ_b dout[b,t,c]
//   LayerNormForward   μ = (1/C) Σ_c x,  σ² = (1/C) Σ_c (x-μ)²,  r = 1/sqrt(σ² + 1e-5),
//                      x̂ = (x-μ)·r,  out = x̂·w + b          (one warp per row)
//   LayerNormBackward  g = dout·w,  dinp += r·(g - mean_c(g) - x̂·mean_c(g·x̂)),
//                      dw += Σ_n dout·x̂,  db += Σ_n dout    (column sums in a fixed order)
//   Gelu               y = ½x(1 + tanh u),  u = √(2/π)(x + 0.044715x³),
//                      dy/dx = ½(1 + tanh u) + ½x(1 - tanh²u)·√(2/π)(1 + 3·0.044715x²)
//   SoftmaxXent        lse = log Σ_v exp(z_v),  p_v = exp(z_v - lse),  loss = lse - z_target,
//                      dz_v = (p_v - [v = target])·dloss
// Rounding: every output is computed in fp32 and rounded to bf16 once; "+=" on a bf16 buffer
// reads it, adds in fp32 and rounds once.
//
// Test: cmake -S . -B build/cuda -G Ninja -DSTRATA_WITH_CUDA=ON &&
//       cmake --build build/cuda --target model_gpt2_cuda_ops_test &&
//       ctest --test-dir build/cuda -R gpt2_cuda_ops   (needs a GPU; skips without one)
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

constexpr int kThreads = 256;

__device__ __forceinline__ float ToF(Bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ Bf16 ToB(float x) { return __float2bfloat16_rn(x); }

// Butterfly reductions: every lane ends with the same value, combined in a fixed order.

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024); all threads get the
// result. `scratch` holds 32 values; the function synchronises before reusing it.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* scratch, Op op, T identity) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

struct AddOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

unsigned GridFor(size_t n, int threads) {
  size_t blocks = (n + threads - 1) / threads;
  // Grid-stride loops cover the rest; enough blocks to fill any current GPU.
  return static_cast<unsigned>(std::min<size_t>(blocks, 65535u * 4));
}

Status LaunchStatus(const char* what) { return CudaStatus(cudaGetLastError(), what); }

// ---- conversions -------------------------------------------------------------------------

__global__ void F32ToBf16Kernel(Bf16* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = ToB(src[i]);
}
__global__ void Bf16ToF32Kernel(float* dst, const Bf16* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = ToF(src[i]);
}
__global__ void AccumulateF32Kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

// ---- embeddings --------------------------------------------------------------------------

__global__ void EmbeddingForwardKernel(Bf16* out, const int32_t* tokens, const Bf16* wte,
                                       const Bf16* wpe, int T, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(n % T);
    const int64_t tok = tokens[n];
    out[i] = ToB(ToF(wte[tok * C + c]) + ToF(wpe[size_t(t) * C + c]));
  }
}

// One block (kThreads threads) per vocabulary row v = blockIdx.x and per tile of
// kWteCols columns (blockIdx.y). The block scans the tokens in chunks of kThreads, compacts
// the positions holding v into shared memory in ascending order (warp ballots + a prefix over
// the warps), and adds their dout rows into per-thread fp32 accumulators: each dwte element
// is the sum of its positions in ascending order, without atomics.
constexpr int kWtePerThread = 4;
constexpr int kWteCols = kThreads * kWtePerThread;

__global__ void __launch_bounds__(kThreads)
    EmbeddingBackwardWteKernel(float* dwte, const Bf16* dout, const int32_t* tokens, int N, int C) {
  __shared__ int positions[kThreads];
  __shared__ int warp_counts[kThreads / 32];
  const int v = blockIdx.x;
  const int c0 = blockIdx.y * kWteCols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[kWtePerThread] = {};
  bool any = false;
  for (int base = 0; base < N; base += kThreads) {
    const int i = base + threadIdx.x;
    const bool match = i < N && tokens[i] == v;
    const unsigned mask = __ballot_sync(kFullMask, match);
    if (lane == 0) warp_counts[warp] = __popc(mask);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) offset += warp_counts[w];
      total += warp_counts[w];
    }
    if (match) positions[offset + __popc(mask & ((1u << lane) - 1u))] = i;
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const Bf16* row = dout + size_t(positions[k]) * C;
#pragma unroll
      for (int j = 0; j < kWtePerThread; ++j) {
        const int c = c0 + threadIdx.x + j * kThreads;
        if (c < C) acc[j] += ToF(row[c]);
      }
    }
    any = any || total > 0;
    __syncthreads();  // positions/warp_counts are rewritten by the next chunk
  }
  if (!any) return;
#pragma unroll
  for (int j = 0; j < kWtePerThread; ++j) {
    const int c = c0 + threadIdx.x + j * kThreads;
    if (c < C) dwte[size_t(v) * C + c] += acc[j];
  }
}

__global__ void EmbeddingBackwardWpeKernel(float* dwpe, const Bf16* dout, int B, int T, int C) {
  const size_t total = size_t(T) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += ToF(dout[size_t(b) * total + i]);
    dwpe[i] += acc;
  }
}

// ---- LayerNorm ---------------------------------------------------------------------------

constexpr float kLayerNormEps = 1e-5f;

// One warp per row; two passes over the row (mean, then centred variance) for accuracy.
__global__ void LayerNormForwardKernel(Bf16* out, float* mean, float* rstd, const Bf16* inp,
                                       const Bf16* w, const Bf16* b, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const Bf16* x = inp + row * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += ToF(x[c]);
  const float m = WarpSum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = ToF(x[c]) - m;
    v += d * d;
  }
  const float r = rsqrtf(WarpSum(v) / C + kLayerNormEps);
  Bf16* y = out + row * C;
  for (int c = lane; c < C; c += 32) y[c] = ToB((ToF(x[c]) - m) * r * ToF(w[c]) + ToF(b[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp for one row per warp.
__global__ void LayerNormBackwardInputKernel(Bf16* dinp, const Bf16* dout, const Bf16* inp,
                                             const Bf16* w, const float* mean, const float* rstd,
                                             int N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const Bf16* x = inp + row * C;
  const Bf16* g = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dn = ToF(g[c]) * ToF(w[c]);
    s1 += dn;
    s2 += dn * (ToF(x[c]) - m) * r;
  }
  s1 = WarpSum(s1) / C;
  s2 = WarpSum(s2) / C;
  Bf16* d = dinp + row * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (ToF(x[c]) - m) * r;
    const float dn = ToF(g[c]) * ToF(w[c]);
    d[c] = ToB(ToF(d[c]) + (dn - s1 - xhat * s2) * r);
  }
}

// Column sums over N rows: block (32, kColRows); thread (tx, ty) sums rows ty, ty+kColRows, ...
// of column blockIdx.x*32+tx, then row 0 of the block adds the kColRows partials in order.
// kLayerNorm: sums1 += Σ dout·x̂ (dw) and sums2 += Σ dout (db); otherwise sums2 += Σ x.
constexpr int kColRows = 32;

template <bool kLayerNorm>
__global__ void __launch_bounds__(32 * kColRows)
    ColumnSumKernel(float* sums1, float* sums2, const Bf16* x, const Bf16* inp, const float* mean,
                    const float* rstd, int N, int C) {
  __shared__ float part1[kColRows][33];
  __shared__ float part2[kColRows][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  float a1 = 0.0f, a2 = 0.0f;
  if (c < C) {
    for (int n = ty; n < N; n += kColRows) {
      const float g = ToF(x[size_t(n) * C + c]);
      a2 += g;
      if constexpr (kLayerNorm) a1 += g * (ToF(inp[size_t(n) * C + c]) - mean[n]) * rstd[n];
    }
  }
  part1[ty][tx] = a1;
  part2[ty][tx] = a2;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  float s1 = 0.0f, s2 = 0.0f;
  for (int k = 0; k < kColRows; ++k) {
    s1 += part1[k][tx];
    s2 += part2[k][tx];
  }
  if constexpr (kLayerNorm) sums1[c] += s1;
  sums2[c] += s2;
}

// ---- element-wise ----------------------------------------------------------------------

__global__ void BroadcastRowsKernel(Bf16* out, const Bf16* row, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = row[i % C];
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

__global__ void GeluForwardKernel(Bf16* out, const Bf16* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = ToF(inp[i]);
    const float u = kGeluK * (x + kGeluA * x * x * x);
    out[i] = ToB(0.5f * x * (1.0f + tanhf(u)));
  }
}

__global__ void GeluBackwardKernel(Bf16* dinp, const Bf16* inp, const Bf16* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = ToF(inp[i]);
    const float th = tanhf(kGeluK * (x + kGeluA * x * x * x));
    const float grad =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluK * (1.0f + 3.0f * kGeluA * x * x);
    dinp[i] = ToB(ToF(dinp[i]) + grad * ToF(dout[i]));
  }
}

__global__ void ResidualForwardKernel(Bf16* out, const Bf16* a, const Bf16* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = ToB(ToF(a[i]) + ToF(b[i]));
}

__global__ void ResidualBackwardKernel(Bf16* da, Bf16* db, const Bf16* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float g = ToF(dout[i]);
    if (da != nullptr) da[i] = ToB(ToF(da[i]) + g);
    if (db != nullptr) db[i] = ToB(ToF(db[i]) + g);
  }
}

// ---- softmax cross-entropy ---------------------------------------------------------------

// One block per row. Each thread reads and writes only its own strided columns, so probs may
// alias logits; the one shared read (the target's logit) happens before any write.
__global__ void __launch_bounds__(kThreads)
    SoftmaxXentForwardKernel(Bf16* probs, float* losses, const Bf16* logits, const int32_t* targets,
                             int V) {
  __shared__ float scratch[32];
  const size_t row = blockIdx.x;
  const Bf16* z = logits + row * V;
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, ToF(z[v]));
  mx = BlockReduce(mx, scratch, MaxOp(), -INFINITY);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(ToF(z[v]) - mx);
  s = BlockReduce(s, scratch, AddOp(), 0.0f);
  const float lse = mx + logf(s);
  const int target = targets[row];
  const float zt = (target >= 0 && target < V) ? ToF(z[target]) : NAN;
  __syncthreads();  // everyone has read z[target] before it may be overwritten
  if (threadIdx.x == 0) losses[row] = lse - zt;
  Bf16* p = probs + row * V;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] = ToB(expf(ToF(z[v]) - lse));
}

// One block: thread k sums losses k, k+1024, ... in double; the block combines them in a
// fixed tree order.
__global__ void __launch_bounds__(1024) MeanKernel(float* mean, const float* losses, int N) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += losses[i];
  s = BlockReduce(s, scratch, AddOp(), 0.0);
  if (threadIdx.x == 0) *mean = static_cast<float>(s / N);
}

__global__ void SoftmaxXentBackwardKernel(Bf16* dlogits, const Bf16* probs, const int32_t* targets,
                                          int V, size_t total, float dloss) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / V;
    const int v = static_cast<int>(i % V);
    const float onehot = (v == targets[row]) ? 1.0f : 0.0f;
    dlogits[i] = ToB((ToF(probs[i]) - onehot) * dloss);
  }
}

Status CheckNonNegative(const char* op, int a, int b, int c = 0, int d = 0) {
  if (a < 0 || b < 0 || c < 0 || d < 0) {
    return Status::InvalidArgument(std::string(op) + ": negative dimension");
  }
  return Status::OK();
}

unsigned RowsGrid(int rows, int rows_per_block) {
  return static_cast<unsigned>((int64_t(rows) + rows_per_block - 1) / rows_per_block);
}

}  // namespace

// ---- shared launchers (gpt2_cuda_kernels.h) -------------------------------------------------

Status LaunchBroadcastRows(cudaStream_t stream, Bf16* out, const Bf16* row, int N, int C) {
  const size_t total = size_t(N) * C;
  if (total == 0) return Status::OK();
  BroadcastRowsKernel<<<GridFor(total, kThreads), kThreads, 0, stream>>>(out, row, C, total);
  return LaunchStatus("BroadcastRowsKernel");
}

Status LaunchMeanLoss(cudaStream_t stream, float* mean, const float* losses, int N) {
  if (N == 0)
    return CudaStatus(cudaMemsetAsync(mean, 0, sizeof(float), stream), "mean loss memset");
  MeanKernel<<<1, 1024, 0, stream>>>(mean, losses, N);
  return LaunchStatus("MeanKernel");
}

Status LaunchColumnSum(cudaStream_t stream, float* sums, const Bf16* x, int N, int C) {
  if (C <= 0) return Status::OK();
  ColumnSumKernel<false><<<RowsGrid(C, 32), dim3(32, kColRows), 0, stream>>>(
      nullptr, sums, x, nullptr, nullptr, nullptr, N, C);
  return LaunchStatus("ColumnSumKernel");
}

// ---- public ops (gpt2_cuda_ops.h) -----------------------------------------------------------

Status ConvertF32ToBf16(const CudaOpContext& ctx, Bf16* dst, const float* src, size_t n) {
  if (n == 0) return Status::OK();
  if (VectorizedElementwise(ctx, {dst, src})) return ConvertF32ToBf16Vec(ctx, dst, src, n);
  F32ToBf16Kernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dst, src, n);
  return LaunchStatus("F32ToBf16Kernel");
}

Status ConvertBf16ToF32(const CudaOpContext& ctx, float* dst, const Bf16* src, size_t n) {
  if (n == 0) return Status::OK();
  if (VectorizedElementwise(ctx, {dst, src})) return ConvertBf16ToF32Vec(ctx, dst, src, n);
  Bf16ToF32Kernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dst, src, n);
  return LaunchStatus("Bf16ToF32Kernel");
}

Status AccumulateF32(const CudaOpContext& ctx, float* dst, const float* src, size_t n) {
  if (n == 0) return Status::OK();
  AccumulateF32Kernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dst, src, n);
  return LaunchStatus("AccumulateF32Kernel");
}

Status EmbeddingForward(const CudaOpContext& ctx, Bf16* out, const int32_t* tokens, const Bf16* wte,
                        const Bf16* wpe, int B, int T, int C) {
  STRATA_RETURN_IF_ERROR(CheckNonNegative("EmbeddingForward", B, T, C));
  const size_t total = size_t(B) * T * C;
  if (total == 0) return Status::OK();
  EmbeddingForwardKernel<<<GridFor(total, kThreads), kThreads, 0, ctx.stream()>>>(out, tokens, wte,
                                                                                  wpe, T, C, total);
  return LaunchStatus("EmbeddingForwardKernel");
}

Status EmbeddingBackward(const CudaOpContext& ctx, float* dwte, float* dwpe, const Bf16* dout,
                         const int32_t* tokens, int B, int T, int C, int V) {
  STRATA_RETURN_IF_ERROR(CheckNonNegative("EmbeddingBackward", B, T, C, V));
  const int64_t N = int64_t(B) * T;
  if (N == 0 || C == 0) return Status::OK();
  if (N > INT32_MAX) return Status::InvalidArgument("EmbeddingBackward: B*T exceeds 2^31-1");
  if (dwte != nullptr && V > 0 && !ctx.kernels().naive_embedding) {
    STRATA_RETURN_IF_ERROR(
        EmbeddingBackwardWteSorted(ctx, dwte, dout, tokens, static_cast<int>(N), C, V));
  } else if (dwte != nullptr && V > 0) {
    const dim3 grid(static_cast<unsigned>(V), RowsGrid(C, kWteCols));
    if (grid.y > 65535) return Status::InvalidArgument("EmbeddingBackward: C too large");
    EmbeddingBackwardWteKernel<<<grid, kThreads, 0, ctx.stream()>>>(dwte, dout, tokens,
                                                                    static_cast<int>(N), C);
    STRATA_RETURN_IF_ERROR(LaunchStatus("EmbeddingBackwardWteKernel"));
  }
  if (dwpe != nullptr) {
    EmbeddingBackwardWpeKernel<<<GridFor(size_t(T) * C, kThreads), kThreads, 0, ctx.stream()>>>(
        dwpe, dout, B, T, C);
    STRATA_RETURN_IF_ERROR(LaunchStatus("EmbeddingBackwardWpeKernel"));
  }
  return Status::OK();
}

Status LayerNormForward(const CudaOpContext& ctx, Bf16* out, float* mean, float* rstd,
                        const Bf16* inp, const Bf16* w, const Bf16* b, int N, int C) {
  STRATA_RETURN_IF_ERROR(CheckNonNegative("LayerNormForward", N, C));
  if (N == 0) return Status::OK();
  if (C == 0) return Status::InvalidArgument("LayerNormForward: C must be positive");
  constexpr int kRowsPerBlock = kThreads / 32;
  LayerNormForwardKernel<<<RowsGrid(N, kRowsPerBlock), kThreads, 0, ctx.stream()>>>(
      out, mean, rstd, inp, w, b, N, C);
  return LaunchStatus("LayerNormForwardKernel");
}

Status LayerNormBackward(const CudaOpContext& ctx, Bf16* dinp, float* dw, float* db,
                         const Bf16* dout, const Bf16* inp, const Bf16* w, const float* mean,
                         const float* rstd, int N, int C) {
  STRATA_RETURN_IF_ERROR(CheckNonNegative("LayerNormBackward", N, C));
  if (N == 0 || C == 0) return Status::OK();
  if (dinp != nullptr) {
    constexpr int kRowsPerBlock = kThreads / 32;
    LayerNormBackwardInputKernel<<<RowsGrid(N, kRowsPerBlock), kThreads, 0, ctx.stream()>>>(
        dinp, dout, inp, w, mean, rstd, N, C);
    STRATA_RETURN_IF_ERROR(LaunchStatus("LayerNormBackwardInputKernel"));
  }
  if (dw != nullptr && db != nullptr) {
    ColumnSumKernel<true><<<RowsGrid(C, 32), dim3(32, kColRows), 0, ctx.stream()>>>(
        dw, db, dout, inp, mean, rstd, N, C);
    STRATA_RETURN_IF_ERROR(LaunchStatus("ColumnSumKernel<LayerNorm>"));
  } else if (dw != nullptr || db != nullptr) {
    return Status::InvalidArgument("LayerNormBackward: dw and db must both be given or both null");
  }
  return Status::OK();
}

Status GeluForward(const CudaOpContext& ctx, Bf16* out, const Bf16* inp, size_t n) {
  if (n == 0) return Status::OK();
  if (VectorizedElementwise(ctx, {out, inp})) return GeluForwardVec(ctx, out, inp, n);
  GeluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(out, inp, n);
  return LaunchStatus("GeluForwardKernel");
}

Status GeluBackward(const CudaOpContext& ctx, Bf16* dinp, const Bf16* inp, const Bf16* dout,
                    size_t n) {
  if (n == 0) return Status::OK();
  if (VectorizedElementwise(ctx, {dinp, inp, dout}))
    return GeluBackwardVec(ctx, dinp, inp, dout, n);
  GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dinp, inp, dout, n);
  return LaunchStatus("GeluBackwardKernel");
}

Status ResidualForward(const CudaOpContext& ctx, Bf16* out, const Bf16* a, const Bf16* b,
                       size_t n) {
  if (n == 0) return Status::OK();
  if (VectorizedElementwise(ctx, {out, a, b})) return ResidualForwardVec(ctx, out, a, b, n);
  ResidualForwardKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(out, a, b, n);
  return LaunchStatus("ResidualForwardKernel");
}

Status ResidualBackward(const CudaOpContext& ctx, Bf16* da, Bf16* db, const Bf16* dout, size_t n) {
  if (n == 0 || (da == nullptr && db == nullptr)) return Status::OK();
  if (VectorizedElementwise(ctx, {da, db, dout})) return ResidualBackwardVec(ctx, da, db, dout, n);
  ResidualBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(da, db, dout, n);
  return LaunchStatus("ResidualBackwardKernel");
}

Status SoftmaxCrossEntropyForward(const CudaOpContext& ctx, Bf16* probs, float* losses,
                                  float* mean_loss, const Bf16* logits, const int32_t* targets,
                                  int N, int V) {
  STRATA_RETURN_IF_ERROR(CheckNonNegative("SoftmaxCrossEntropyForward", N, V));
  if (V == 0 && N > 0) return Status::InvalidArgument("SoftmaxCrossEntropyForward: V must be > 0");
  if (N > 0) {
    SoftmaxXentForwardKernel<<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(
        probs, losses, logits, targets, V);
    STRATA_RETURN_IF_ERROR(LaunchStatus("SoftmaxXentForwardKernel"));
  }
  if (mean_loss != nullptr) return LaunchMeanLoss(ctx.stream(), mean_loss, losses, N);
  return Status::OK();
}

Status SoftmaxCrossEntropyBackward(const CudaOpContext& ctx, Bf16* dlogits, const Bf16* probs,
                                   const int32_t* targets, int N, int V, float dloss) {
  STRATA_RETURN_IF_ERROR(CheckNonNegative("SoftmaxCrossEntropyBackward", N, V));
  const size_t total = size_t(N) * V;
  if (total == 0) return Status::OK();
  SoftmaxXentBackwardKernel<<<GridFor(total, kThreads), kThreads, 0, ctx.stream()>>>(
      dlogits, probs, targets, V, total, dloss);
  return LaunchStatus("SoftmaxXentBackwardKernel");
}

}  // namespace strata::model::cuda_ops
