// Launchers shared between the GPT-2 CUDA op files (internal to model/cuda/): small kernels
// that the cuBLAS-based matrix products (gpt2_cuda_matmul.cc) need around their GEMMs. They
// enqueue on `stream` and return a Cuda status when the launch fails. Not thread-safe beyond
// what the stream allows.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>

#include "model/cuda/gpt2_cuda_matmul_plan.h"
#include "strata/status.h"

namespace strata::model::cuda_ops {

class CudaOpContext;
struct KernelChoice;

// A Cuda status for a cuBLAS error ("<what>: <name> (<string>)"), or OK.
Status CublasStatus(cublasStatus_t st, const char* what);

// out[n, c] = row[c] for n < N, c < C (the bias broadcast that a GEMM then adds to).
Status LaunchBroadcastRows(cudaStream_t stream, __nv_bfloat16* out, const __nv_bfloat16* row, int N,
                           int C);
// *mean = (1/N) Σ losses[n], summed in double in a fixed order (0 when N == 0).
Status LaunchMeanLoss(cudaStream_t stream, float* mean, const float* losses, int N);
// sums[c] += Σ_{n<N} x[n, c] in fp32 (bias gradients). Fixed summation order.
Status LaunchColumnSum(cudaStream_t stream, float* sums, const __nv_bfloat16* x, int N, int C);

// dwte[tokens[n], :] += dout[n, :] by a sort of the positions by token and a segmented sum
// (gpt2_cuda_embedding.cu): EmbeddingBackward's dwte unless KernelChoice::naive_embedding.
Status EmbeddingBackwardWteSorted(const CudaOpContext& ctx, float* dwte, const __nv_bfloat16* dout,
                                  const int32_t* tokens, int N, int C, int V);

// The 128-bit elementwise kernels (gpt2_cuda_elementwise.cu). VectorizedElementwise: whether
// to use them (KernelChoice::naive_elementwise unset, every non-null pointer 16-byte aligned).
bool VectorizedElementwise(const CudaOpContext& ctx, std::initializer_list<const void*> ptrs);
Status GeluForwardVec(const CudaOpContext& ctx, __nv_bfloat16* out, const __nv_bfloat16* inp,
                      size_t n);
Status GeluBackwardVec(const CudaOpContext& ctx, __nv_bfloat16* dinp, const __nv_bfloat16* inp,
                       const __nv_bfloat16* dout, size_t n);
Status ResidualForwardVec(const CudaOpContext& ctx, __nv_bfloat16* out, const __nv_bfloat16* a,
                          const __nv_bfloat16* b, size_t n);
Status ResidualBackwardVec(const CudaOpContext& ctx, __nv_bfloat16* da, __nv_bfloat16* db,
                           const __nv_bfloat16* dout, size_t n);
Status ConvertF32ToBf16Vec(const CudaOpContext& ctx, __nv_bfloat16* dst, const float* src,
                           size_t n);
Status ConvertBf16ToF32Vec(const CudaOpContext& ctx, float* dst, const __nv_bfloat16* src,
                           size_t n);

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (false when either is null or
// empty): the ops check the aliasing rules gpt2_cuda_ops.h documents with it.
inline bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// dst[i] += src[i] over n floats (fp32; gpt2_cuda_elementwise.cu).
Status LaunchAddF32(cudaStream_t stream, float* dst, const float* src, size_t n);

using LtCall = LtCallT<__nv_bfloat16>;  // gpt2_cuda_matmul_plan.h
// The algorithm cuBLASLt's heuristic chose per call shape (LtAlgoKey), or that it offered
// none; one per CudaOpContext (its cuBLASLt handle and GPU). Scratch, like the workspace.
struct LtAlgoCache {
  struct Entry {
    bool found = false;  // false: the heuristic offered no algorithm (the caller falls back)
    cublasLtMatmulAlgo_t algo{};
  };
  std::mutex mu;
  std::map<LtAlgoKey, Entry> entries;
  uint64_t hits = 0, misses = 0;  // heuristic calls saved / made
};
// Runs `c` with `workspace` (LtWorkspaceBytes() bytes). NotSupported when cuBLASLt offers no
// algorithm for it (the caller falls back); Cuda for any other failure.
Status RunLt(const CudaOpContext& ctx, const LtCall& c, void* workspace, const char* what);
size_t LtWorkspaceBytes();

// The workspace the tuned attention (gpt2_cuda_attention_gemm.cu) and embedding backward
// (gpt2_cuda_embedding.cu) take; 0 for the naive or flash kernels (flash where
// FlashAttentionSupports the shape on a device of capability `sm`) or empty shapes.
size_t AttentionWorkspaceBytes(const KernelChoice& kernels, int sm, int B, int T, int C, int NH);
size_t EmbeddingWorkspaceBytes(int N);

// The warp-per-row attention kernels (gpt2_cuda_attention.cu): AttentionForward/Backward of
// gpt2_cuda_ops.h when KernelChoice::naive_attention is set.
Status AttentionForwardNaive(const CudaOpContext& ctx, __nv_bfloat16* out, float* stats,
                             const __nv_bfloat16* qkv, int B, int T, int C, int NH);
Status AttentionBackwardNaive(const CudaOpContext& ctx, __nv_bfloat16* dqkv,
                              const __nv_bfloat16* dout, const __nv_bfloat16* qkv, float* stats,
                              int B, int T, int C, int NH);

// The flash attention kernels (gpt2_cuda_attention_flash.cu): AttentionForward/Backward of
// gpt2_cuda_ops.h when KernelChoice::flash_attention is set and FlashAttentionSupports(B, C, NH,
// ctx.compute_capability()) (compute capability 8.0 or more, head size 64 or 128, at most
// 65535 heads; else the cuBLAS path runs); called directly, NotSupported naming the device's
// capability or InvalidArgument naming the shape otherwise.
bool FlashAttentionSupports(int B, int C, int NH, int sm);
Status FlashAttentionForward(const CudaOpContext& ctx, __nv_bfloat16* out, float* stats,
                             const __nv_bfloat16* qkv, int B, int T, int C, int NH);
Status FlashAttentionBackward(const CudaOpContext& ctx, __nv_bfloat16* dqkv,
                              const __nv_bfloat16* dout, const __nv_bfloat16* qkv, float* stats,
                              int B, int T, int C, int NH);

}  // namespace strata::model::cuda_ops
