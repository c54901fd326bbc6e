// The matrix products of GPT-2 on CUDA through cuBLAS, and the CudaOpContext.
//
// Computes (row-major, N token rows):
//   MatmulForward:   out[N,OC]  = inp[N,IC] · w[IC,OC] + bias[OC]
//   MatmulBackward:  dinp[N,IC] += dout · wᵀ;  dw[IC,OC] += inpᵀ · dout;  dbias += Σ_n dout[n,:]
//   LmHeadForward:   logits[N,V] = x[N,C] · wteᵀ
//   LmHeadBackward:  dx[N,C] += dlogits · wte;  dwte[V,C] += dlogitsᵀ · x
// with cublasGemmEx: bf16 A and B, CUBLAS_COMPUTE_32F (fp32 accumulation), C in bf16 for
// activations and fp32 for parameter gradients.
//
// cuBLAS is column-major; a row-major [R,K] buffer is the column-major K×R matrix, i.e. its
// transpose. So a row-major product Y[N,OC] = X[N,IC] · W[IC,OC] is computed as the
// column-major Yᵀ (OC×N) = Wᵀ (OC×IC) · Xᵀ (IC×N) with m=OC, n=N, k=IC and no transposes.
//
// Test: ctest --test-dir build/cuda -R gpt2_cuda_ops (needs a GPU; skips without one).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"

namespace strata::model::cuda_ops {
namespace {

// Column-major C(m×n) = alpha · op(A)(m×k) · op(B)(k×n) + beta · C, bf16 A/B, fp32 compute.
Status Gemm(const CudaOpContext& ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
            int k, const Bf16* a, int lda, const Bf16* b, int ldb, void* c, cudaDataType_t c_type,
            int ldc, float beta, const char* what) {
  if (m == 0 || n == 0) return Status::OK();
  const float alpha = 1.0f;
  if (k == 0) {
    // cuBLAS treats k == 0 as C = beta·C; nothing to add when accumulating.
    if (beta == 1.0f) return Status::OK();
  }
  return CublasStatus(
      cublasGemmEx(ctx.cublas(), ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                   &beta, c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      what);
}

Status CheckDims(int N, int a, int b, const char* op) {
  if (N < 0 || a < 0 || b < 0) {
    return Status::InvalidArgument(std::string(op) +
                                   ": negative dimension (N=" + std::to_string(N) + ", " +
                                   std::to_string(a) + ", " + std::to_string(b) + ")");
  }
  return Status::OK();
}

// out (OC×N col-major) = W·X + bias through cuBLASLt's BIAS or GELU_AUX_BIAS epilogue
// (`pre` non-null: out = GELU(W·X + bias), pre = W·X + bias). NotSupported: fall back.
Status LtForward(const CudaOpContext& ctx, Bf16* out, Bf16* pre, const Bf16* inp, const Bf16* w,
                 const Bf16* bias, int N, int IC, int OC) {
  if (ctx.kernels().naive_matmul || N == 0 || IC == 0 || OC == 0) {
    return Status::NotSupported("naive matmul");
  }
  if (pre != nullptr && OC % 8 != 0) return Status::NotSupported("GELU aux needs OC % 8 == 0");
  // The bias is staged behind the GEMM's workspace, at a 256-byte boundary: the heuristic
  // reads the bias pointer's alignment, and the parameters' addresses differ between the
  // engine's resident and offloaded runs, which must choose the same algorithm.
  const size_t ws_bytes = LtWorkspaceBytes();
  STRATA_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(ws_bytes + sizeof(Bf16) * size_t(OC)));
  Bf16* staged = reinterpret_cast<Bf16*>(static_cast<char*>(ws) + ws_bytes);
  STRATA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(staged, bias, sizeof(Bf16) * size_t(OC),
                                                    cudaMemcpyDeviceToDevice, ctx.stream()),
                                    "stage bias"));
  const LtCall c = LinearForwardCall<Bf16>(out, pre, inp, w, staged, N, IC, OC);
  return RunLt(
      ctx, c, ws,
      pre != nullptr ? "MatmulGeluForward cublasLtMatmul" : "MatmulForward cublasLtMatmul");
}

}  // namespace

Status MatmulForward(const CudaOpContext& ctx, Bf16* out, const Bf16* inp, const Bf16* w,
                     const Bf16* bias, int N, int IC, int OC) {
  STRATA_RETURN_IF_ERROR(CheckDims(N, IC, OC, "MatmulForward"));
  if (bias != nullptr) {
    const Status lt = LtForward(ctx, out, nullptr, inp, w, bias, N, IC, OC);
    if (lt.code() != StatusCode::kNotSupported) return lt;
  }
  float beta = 0.0f;
  if (bias != nullptr) {
    // out = bias broadcast, then out = inp·w + out: the bias is added in fp32 inside the
    // GEMM epilogue and the sum is rounded to bf16 once.
    STRATA_RETURN_IF_ERROR(LaunchBroadcastRows(ctx.stream(), out, bias, N, OC));
    beta = 1.0f;
  }
  if (IC == 0 && bias == nullptr) {
    return CudaStatus(cudaMemsetAsync(out, 0, sizeof(Bf16) * size_t(N) * OC, ctx.stream()),
                      "MatmulForward memset");
  }
  return Gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, IC, w, OC, inp, IC, out, CUDA_R_16BF, OC, beta,
              "MatmulForward cublasGemmEx");
}

Status MatmulBackward(const CudaOpContext& ctx, Bf16* dinp, float* dw, float* dbias,
                      const Bf16* dout, const Bf16* inp, const Bf16* w, int N, int IC, int OC) {
  STRATA_RETURN_IF_ERROR(CheckDims(N, IC, OC, "MatmulBackward"));
  if (dinp != nullptr) {
    // dinpᵀ (IC×N) += (w as col-major OC×IC)ᵀ · doutᵀ (OC×N).
    STRATA_RETURN_IF_ERROR(Gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, IC, N, OC, w, OC, dout, OC, dinp,
                                CUDA_R_16BF, IC, 1.0f, "MatmulBackward dinp cublasGemmEx"));
  }
  if (dw != nullptr && dbias != nullptr && !ctx.kernels().naive_matmul && N > 0 && IC > 0 &&
      OC > 0) {
    // dw through cuBLASLt, its BGRADA epilogue reducing A = doutᵀ over k = N into a scratch
    // (written, not accumulated) that is then added to dbias.
    const size_t ws_bytes = LtWorkspaceBytes();
    STRATA_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(ws_bytes + sizeof(float) * size_t(OC)));
    float* db = reinterpret_cast<float*>(static_cast<char*>(ws) + ws_bytes);
    const LtCall c = WeightGradCall<Bf16>(dw, db, dout, inp, N, IC, OC);
    const Status lt = RunLt(ctx, c, ws, "MatmulBackward dw+dbias cublasLtMatmul");
    if (lt.ok()) return LaunchAddF32(ctx.stream(), dbias, db, size_t(OC));
    if (lt.code() != StatusCode::kNotSupported) return lt;
  }
  if (dw != nullptr) {
    // dwᵀ (OC×IC) += doutᵀ (OC×N) · (inp as col-major IC×N)ᵀ.
    STRATA_RETURN_IF_ERROR(Gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, OC, IC, N, dout, OC, inp, IC, dw,
                                CUDA_R_32F, OC, 1.0f, "MatmulBackward dw cublasGemmEx"));
  }
  if (dbias != nullptr) {
    STRATA_RETURN_IF_ERROR(LaunchColumnSum(ctx.stream(), dbias, dout, N, OC));
  }
  return Status::OK();
}

Status MatmulGeluForward(const CudaOpContext& ctx, Bf16* out, Bf16* pre, const Bf16* inp,
                         const Bf16* w, const Bf16* bias, int N, int IC, int OC) {
  STRATA_RETURN_IF_ERROR(CheckDims(N, IC, OC, "MatmulGeluForward"));
  if (bias == nullptr) return Status::InvalidArgument("MatmulGeluForward: bias is required");
  const Status lt = LtForward(ctx, out, pre, inp, w, bias, N, IC, OC);
  if (lt.code() != StatusCode::kNotSupported) return lt;
  STRATA_RETURN_IF_ERROR(MatmulForward(ctx, pre, inp, w, bias, N, IC, OC));
  return GeluForward(ctx, out, pre, size_t(N) * OC);
}

Status MatmulDgeluBackward(const CudaOpContext& ctx, Bf16* dpre, Bf16* scratch, const Bf16* dout,
                           const Bf16* pre, const Bf16* w, int N, int IC, int OC) {
  STRATA_RETURN_IF_ERROR(CheckDims(N, IC, OC, "MatmulDgeluBackward"));
  const size_t n = size_t(N) * IC;
  const size_t bytes = sizeof(Bf16) * n;
  if (Overlaps(dpre, bytes, scratch, bytes) || Overlaps(dpre, bytes, pre, bytes) ||
      Overlaps(dpre, bytes, dout, sizeof(Bf16) * size_t(N) * OC)) {
    return Status::InvalidArgument(
        "MatmulDgeluBackward: dpre overlaps scratch, dout or pre (it is overwritten while they "
        "are read); give dpre its own buffer");
  }
  if (!ctx.kernels().naive_matmul && N > 0 && IC > 0 && OC > 0 && IC % 8 == 0) {
    const LtCall c = DgeluCall<Bf16>(dpre, pre, dout, w, N, IC, OC);
    STRATA_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(LtWorkspaceBytes()));
    const Status lt = RunLt(ctx, c, ws, "MatmulDgeluBackward cublasLtMatmul");
    if (lt.code() != StatusCode::kNotSupported) return lt;
  }
  // The GEMM into scratch, then GELU's backward.
  STRATA_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(scratch, 0, n * sizeof(Bf16), ctx.stream()), "memset"));
  STRATA_RETURN_IF_ERROR(
      MatmulBackward(ctx, scratch, nullptr, nullptr, dout, nullptr, w, N, IC, OC));
  STRATA_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(dpre, 0, n * sizeof(Bf16), ctx.stream()), "memset"));
  return GeluBackward(ctx, dpre, pre, scratch, n);
}

Status LmHeadForward(const CudaOpContext& ctx, Bf16* logits, const Bf16* x, const Bf16* wte, int N,
                     int C, int V) {
  STRATA_RETURN_IF_ERROR(CheckDims(N, C, V, "LmHeadForward"));
  if (C == 0) {
    return CudaStatus(cudaMemsetAsync(logits, 0, sizeof(Bf16) * size_t(N) * V, ctx.stream()),
                      "LmHeadForward memset");
  }
  // logitsᵀ (V×N) = (wte as col-major C×V)ᵀ · xᵀ (C×N).
  return Gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, wte, C, x, C, logits, CUDA_R_16BF, V, 0.0f,
              "LmHeadForward cublasGemmEx");
}

Status LmHeadBackward(const CudaOpContext& ctx, Bf16* dx, float* dwte, const Bf16* dlogits,
                      const Bf16* x, const Bf16* wte, int N, int C, int V) {
  STRATA_RETURN_IF_ERROR(CheckDims(N, C, V, "LmHeadBackward"));
  if (dx != nullptr) {
    // dxᵀ (C×N) += wteᵀ (C×V, wte as col-major) · dlogitsᵀ (V×N).
    STRATA_RETURN_IF_ERROR(Gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, wte, C, dlogits, V, dx,
                                CUDA_R_16BF, C, 1.0f, "LmHeadBackward dx cublasGemmEx"));
  }
  if (dwte != nullptr) {
    // dwteᵀ (C×V) += xᵀ (C×N) · (dlogits as col-major V×N)ᵀ.
    STRATA_RETURN_IF_ERROR(Gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, x, C, dlogits, V, dwte,
                                CUDA_R_32F, C, 1.0f, "LmHeadBackward dwte cublasGemmEx"));
  }
  return Status::OK();
}

}  // namespace strata::model::cuda_ops
