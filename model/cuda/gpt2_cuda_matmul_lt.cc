// The linear layers through cuBLASLt with epilogues (the default unless
// KernelChoice::naive_matmul): the bias added inside the GEMM (EPILOGUE_BIAS) instead of a
// broadcast kernel before it; bias + GELU with the pre-activation kept for backward
// (GELU_AUX_BIAS) instead of a separate GELU kernel; GELU's gradient applied to the dinp GEMM
// (DGELU); the bias gradient reduced by the dw GEMM (BGRADA) instead of a column-sum kernel.
//
// Each call builds its descriptors, takes the best algorithm given the pointers' alignment
// (cuBLASLt assumes 256 bytes unless told; we say 16, see LtAlignmentOf) with a 32 MiB
// workspace from the context (the heuristic is asked once per call shape: ChooseAlgo), and
// runs it. When the heuristic offers no algorithm for an epilogue (some
// shapes, alignments or GPUs lack one, or refuse the combination), the caller falls back to the
// cublasGemmEx path and the separate kernels: RunLt returns NotSupported for that, and only for
// that. Which path ran is not reported per call; gpu_model_bench's kernel rows time both.
//
// Layout rule as in gpt2_cuda_matmul.cc: a row-major [R,K] buffer is the column-major K×R
// matrix, so out[N,OC] = inp[N,IC] · w[IC,OC] is D (OC×N) = W (OC×IC, op N) · X (IC×N, op N),
// and the bias, a vector over D's rows, is over OC.
//
// Test: ctest --test-dir build/release -R gpt2_cuda_ops (GpuOpsTest.Matmul, MatmulGelu,
// WholeBlock; needs a GPU)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"

namespace strata::model::cuda_ops {
namespace {

constexpr size_t kLtWorkspace = size_t{32} << 20;

// Owns the descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename T>
Status SetDesc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v,
               const char* what) {
  return CublasStatus(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v), what);
}

// The heuristic's algorithm for `c`, asked once per call shape (LtAlgoKeyOf) and kept in the
// context's cache: the heuristic costs tens of microseconds a call, and the model makes a few
// hundred calls a step of a few dozen shapes. The same key gets the same answer, so caching
// changes no bit. NotSupported (cached too) when the heuristic offers none: any refusal
// (no algorithm, or an epilogue / type combination this cuBLASLt or GPU does not take:
// NOT_SUPPORTED or INVALID_VALUE) leaves the caller's fallback to run.
Result<cublasLtMatmulAlgo_t> ChooseAlgo(const CudaOpContext& ctx, const LtCall& c, const LtDescs& x,
                                        const char* what) {
  const LtAlgoKey key = LtAlgoKeyOf(c);
  LtAlgoCache& cache = ctx.lt_algos();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.entries.find(key);
    if (it != cache.entries.end()) {
      ++cache.hits;
      if (!it->second.found) {
        return Status::NotSupported(std::string(what) + ": cuBLASLt offers no algorithm");
      }
      return it->second.algo;
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), x.op, x.a, x.b, x.d, x.d,
                                                           x.pref, 1, &result, &found);
  const bool ok = hs == CUBLAS_STATUS_SUCCESS && found > 0;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    ++cache.misses;
    cache.entries[key] = LtAlgoCache::Entry{ok, ok ? result.algo : cublasLtMatmulAlgo_t{}};
  }
  if (!ok) {
    return Status::NotSupported(std::string(what) + ": cuBLASLt offers no algorithm (" +
                                cublasGetStatusName(hs) + ", " + std::to_string(found) + " found)");
  }
  return result.algo;
}

}  // namespace

Status RunLt(const CudaOpContext& ctx, const LtCall& c, void* workspace, const char* what) {
  LtDescs x;
  STRATA_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  STRATA_RETURN_IF_ERROR(SetDesc(x.op, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(c.ta), "TRANSA"));
  STRATA_RETURN_IF_ERROR(SetDesc(x.op, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(c.tb), "TRANSB"));
  STRATA_RETURN_IF_ERROR(SetDesc(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE, c.epilogue, "EPILOGUE"));
  if (c.bias != nullptr) {
    STRATA_RETURN_IF_ERROR(
        SetDesc(x.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias, "BIAS_POINTER"));
    STRATA_RETURN_IF_ERROR(
        SetDesc(x.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(c.bias_type), "BIAS_DATA_TYPE"));
  }
  if (c.aux != nullptr) {
    STRATA_RETURN_IF_ERROR(
        SetDesc(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux, "EPILOGUE_AUX_POINTER"));
    STRATA_RETURN_IF_ERROR(
        SetDesc(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.aux_ld, "EPILOGUE_AUX_LD"));
    STRATA_RETURN_IF_ERROR(SetDesc(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                   int32_t(CUDA_R_16BF), "EPILOGUE_AUX_DATA_TYPE"));
  }
  const bool ta = c.ta != CUBLAS_OP_N, tb = c.tb != CUBLAS_OP_N;
  STRATA_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutCreate(&x.a, CUDA_R_16BF, ta ? c.k : c.m, ta ? c.m : c.k, c.lda),
      "cublasLtMatrixLayoutCreate(A)"));
  STRATA_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutCreate(&x.b, CUDA_R_16BF, tb ? c.n : c.k, tb ? c.k : c.n, c.ldb),
      "cublasLtMatrixLayoutCreate(B)"));
  STRATA_RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&x.d, c.d_type, c.m, c.n, c.ldd),
                                      "cublasLtMatrixLayoutCreate(D)"));
  STRATA_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&x.pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t ws_bytes = kLtWorkspace;
  STRATA_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ws_bytes, sizeof ws_bytes),
      "PREF_MAX_WORKSPACE_BYTES"));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, c.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, c.b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c.d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c.d}};
  for (const auto& [attr, ptr] : aligns) {
    const uint32_t align = LtAlignmentOf(ptr);
    STRATA_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulPreferenceSetAttribute(x.pref, attr, &align, sizeof align),
                     "PREF_MIN_ALIGNMENT"));
  }
  STRATA_ASSIGN_OR_RETURN(const cublasLtMatmulAlgo_t algo, ChooseAlgo(ctx, c, x, what));
  const cublasStatus_t ms =
      cublasLtMatmul(ctx.cublaslt(), x.op, &c.alpha, c.a, x.a, c.b, x.b, &c.beta, c.d, x.d, c.d,
                     x.d, &algo, workspace, kLtWorkspace, ctx.stream());
  if (ms == CUBLAS_STATUS_NOT_SUPPORTED) {
    return Status::NotSupported(std::string(what) + ": cublasLtMatmul NOT_SUPPORTED");
  }
  return CublasStatus(ms, what);
}

size_t LtWorkspaceBytes() { return kLtWorkspace; }

size_t ModelWorkspaceBytes(const KernelChoice& kernels, int sm, int B, int T, int C, int NH) {
  const size_t lt = kernels.naive_matmul ? 0 : kLtWorkspace + sizeof(float) * 4 * size_t(C);
  const size_t attention = AttentionWorkspaceBytes(kernels, sm, B, T, C, NH);
  const size_t embedding =
      kernels.naive_embedding ? 0 : EmbeddingWorkspaceBytes(int(int64_t(B) * T));
  return std::max({lt, attention, embedding});
}

size_t ModelWorkspaceBytes(const CudaOpContext& ctx, int B, int T, int C, int NH) {
  return ModelWorkspaceBytes(ctx.kernels(), ctx.compute_capability(), B, T, C, NH);
}

}  // namespace strata::model::cuda_ops
