// CudaOpContext (the stream, cuBLAS handle, kernel choice and workspace every GPT-2 CUDA op
// runs with) and the status helpers shared by the op files. See gpt2_cuda_ops.h.
//
// Test: ctest --test-dir build/release -R gpt2_cuda_ops (KernelChoice parsing runs without a
// GPU; the rest skips without one).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "strata/env.h"
#include "strata/kernel_record.h"

namespace strata::model::cuda_ops {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return Status::Cuda(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                      cudaGetErrorString(err) + ")");
}

Status CublasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::Cuda(std::string(what) + ": " + cublasGetStatusName(st) + " (" +
                      cublasGetStatusString(st) + ")");
}

namespace {

struct NamedKernel {
  const char* name;
  bool KernelChoice::*naive;
};
constexpr NamedKernel kNamedKernels[] = {
    {"attention", &KernelChoice::naive_attention},
    {"embedding", &KernelChoice::naive_embedding},
    {"classifier", &KernelChoice::naive_classifier},
    {"matmul", &KernelChoice::naive_matmul},
    {"elementwise", &KernelChoice::naive_elementwise},
};

}  // namespace

KernelChoice KernelChoice::Recorded() { return *Parse(""); }

Result<KernelChoice> KernelChoice::Parse(const std::string& spec) {
  STRATA_ASSIGN_OR_RETURN(const KernelSelection selection, KernelSelection::Parse(spec));
  KernelChoice k;
  for (const NamedKernel& n : kNamedKernels) {
    const std::string_view variant = selection.Of(n.name).variant;
    k.*n.naive = variant == "naive";
    if (variant == "flash") k.flash_attention = true;
  }
  return k;
}

Result<KernelChoice> KernelChoice::FromEnv() { return Parse(RunKernelSpec()); }

std::string KernelChoice::Variant(const std::string& family) const {
  if (family == "attention" && flash_attention) return "flash";
  for (const NamedKernel& n : kNamedKernels) {
    if (family == n.name) return this->*n.naive ? "naive" : "tuned";
  }
  return "";
}

std::string KernelChoice::ToString() const {
  std::string spec;
  for (const NamedKernel& n : kNamedKernels) {
    if (!spec.empty()) spec += ',';
    spec += std::string(n.name) + "=" + Variant(n.name);
  }
  return spec;
}

Result<std::unique_ptr<CudaOpContext>> CudaOpContext::Create(cudaStream_t stream) {
  STRATA_ASSIGN_OR_RETURN(KernelChoice kernels, KernelChoice::FromEnv());
  cublasHandle_t handle = nullptr;
  STRATA_RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle), "cublasCreate"));
  Status st = CublasStatus(cublasSetStream(handle, stream), "cublasSetStream");
  if (st.ok()) {
    // Tensor cores with bf16 inputs are used regardless; this only keeps cuBLAS from
    // choosing reduced-precision fp32 emulation paths.
    st = CublasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  cublasLtHandle_t lt = nullptr;
  if (st.ok()) st = CublasStatus(cublasLtCreate(&lt), "cublasLtCreate");
  if (!st.ok()) {
    cublasDestroy(handle);
    return st;
  }
  std::unique_ptr<CudaOpContext> ctx(new CudaOpContext(stream, handle, lt));
  ctx->kernels_ = kernels;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess) {
    ctx->compute_capability_ = major * 10 + minor;
  } else {
    (void)cudaGetLastError();
  }
  ctx->lt_algos_ = std::make_shared<LtAlgoCache>();
  return ctx;
}

CudaOpContext::~CudaOpContext() {
  if (workspace_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaFree(workspace_);
  }
  if (cublaslt_ != nullptr) cublasLtDestroy(cublaslt_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

Result<void*> CudaOpContext::Workspace(size_t bytes) const {
  if (bytes <= workspace_bytes_) return workspace_;
  // Work already enqueued may still read the old buffer.
  STRATA_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "workspace: synchronize"));
  if (workspace_ != nullptr) {
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaFree(workspace_), "workspace: cudaFree"));
    workspace_ = nullptr;
    workspace_bytes_ = 0;
  }
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free allocation error
    return Status::OutOfMemory("CUDA op workspace of " + std::to_string(bytes) +
                               " bytes: " + cudaGetErrorString(err));
  }
  workspace_ = p;
  workspace_bytes_ = bytes;
  return p;
}

}  // namespace strata::model::cuda_ops
