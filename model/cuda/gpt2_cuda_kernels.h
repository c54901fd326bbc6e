// Launchers shared between the GPT-2 CUDA op files (internal to model/cuda/): small kernels
// that the cuBLAS-based matrix products (gpt2_cuda_matmul.cc) need around their GEMMs. They
// enqueue on `stream` and return a Cuda status when the launch fails. Not thread-safe beyond
// what the stream allows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "strata/status.h"

namespace strata::model::cuda_ops {

// out[n, c] = row[c] for n < N, c < C (the bias broadcast that a GEMM then adds to).
Status LaunchBroadcastRows(cudaStream_t stream, __nv_bfloat16* out, const __nv_bfloat16* row, int N,
                           int C);
// sums[c] += Σ_{n<N} x[n, c] in fp32 (bias gradients). Fixed summation order.
Status LaunchColumnSum(cudaStream_t stream, float* sums, const __nv_bfloat16* x, int N, int C);

}  // namespace strata::model::cuda_ops
