// The cuBLASLt calls of the linear layers (gpt2_cuda_matmul.cc) as plain descriptions, so that
// a CPU test can run them through a host emulation of cuBLASLt's column-major semantics and
// epilogues and check them against the CPU reference (tests/model/cuda/matmul_plan_test.cc)
// without a GPU.
//
// Layout rule: a row-major [R,K] buffer is the column-major K×R matrix, so out[N,OC] =
// inp[N,IC] · w[IC,OC] is D (OC×N) = W (OC×IC, op N) · X (IC×N, op N); a bias over OC is a
// vector over D's rows (cuBLASLt's bias length = D's rows).
//
// Internal to model/cuda/. Header-only; needs cuBLASLt's enums only.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <tuple>

namespace strata::model::cuda_ops {

// One cuBLASLt matmul, column-major D(m×n) = epilogue(alpha·op(A)·op(B) + beta·D), A and B of
// type In, fp32 compute.
template <typename In>
struct LtCallT {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  const In* a = nullptr;
  int lda = 0;
  const In* b = nullptr;
  int ldb = 0;
  void* d = nullptr;
  cudaDataType_t d_type = CUDA_R_16BF;
  int ldd = 0;
  float alpha = 1.0f, beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // EPILOGUE_BIAS / GELU_AUX_BIAS: the bias over D's m rows (input); BGRADA: its gradient
  // (output, written, not accumulated): Σ over k of op(A)'s row.
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_16BF;
  // GELU_AUX_BIAS: the pre-activation (output); DGELU: the pre-activation (input). m × n with
  // leading dimension aux_ld (a multiple of 8).
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

// The largest power of two up to 16 dividing the address (16 for nullptr). Capped at 16 (what
// the tensor-core kernels need) rather than cuBLASLt's 256 so that the algorithm chosen does
// not depend on where a buffer happens to sit: the engine's resident and offloaded runs hand
// the model parameters at different addresses, and must give the same bits.
inline uint32_t LtAlignmentOf(const void* p) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 16;
  while (a > 1 && x % a != 0) a /= 2;
  return a;
}

// What decides cuBLASLt's heuristic for a call: transposes, shapes, leading dimensions,
// types, the epilogue, and the alignments promised (LtAlignmentOf), never the addresses
// themselves. Calls with equal keys get the same algorithm, so RunLt asks the heuristic once
// per key (CudaOpContext's LtAlgoCache) and every later call of that shape reuses it.
struct LtAlgoKey {
  int32_t ta = 0, tb = 0, m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  int32_t d_type = 0, epilogue = 0;
  int32_t bias_type = -1;  // -1: no bias
  int64_t aux_ld = -1;     // -1: no aux
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  auto Tie() const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldd, d_type, epilogue, bias_type, aux_ld, align_a,
                    align_b, align_d);
  }
  // (No defaulted <=>: nvcc compiles this header for the .cu files too.)
  bool operator<(const LtAlgoKey& o) const { return Tie() < o.Tie(); }
  bool operator==(const LtAlgoKey& o) const { return Tie() == o.Tie(); }
  bool operator!=(const LtAlgoKey& o) const { return !(*this == o); }
};

template <typename In>
LtAlgoKey LtAlgoKeyOf(const LtCallT<In>& c) {
  LtAlgoKey key;
  key.ta = int32_t(c.ta), key.tb = int32_t(c.tb);
  key.m = c.m, key.n = c.n, key.k = c.k;
  key.lda = c.lda, key.ldb = c.ldb, key.ldd = c.ldd;
  key.d_type = int32_t(c.d_type), key.epilogue = int32_t(c.epilogue);
  if (c.bias != nullptr) key.bias_type = int32_t(c.bias_type);
  if (c.aux != nullptr) key.aux_ld = c.aux_ld;
  key.align_a = LtAlignmentOf(c.a);
  key.align_b = LtAlignmentOf(c.b);
  key.align_d = LtAlignmentOf(c.d);
  return key;
}

// out[N,OC] = inp · w + bias (BIAS), or with `pre`: pre = inp · w + bias, out = GELU(pre)
// (GELU_AUX_BIAS). bf16 out, pre and bias.
template <typename In>
LtCallT<In> LinearForwardCall(void* out, void* pre, const In* inp, const In* w, const void* bias,
                              int N, int IC, int OC) {
  LtCallT<In> c;
  c.m = OC, c.n = N, c.k = IC;
  c.a = w, c.lda = OC, c.b = inp, c.ldb = IC;
  c.d = out, c.d_type = CUDA_R_16BF, c.ldd = OC;
  c.epilogue = pre != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  c.bias = bias, c.bias_type = CUDA_R_16BF;
  c.aux = pre, c.aux_ld = OC;
  return c;
}

// dw[IC,OC] += inpᵀ · dout (dwᵀ (OC×IC) += doutᵀ (OC×N) · inp, fp32), and dbias_out[OC] =
// Σ_n dout[n,:] (BGRADA over k = N; fp32, written).
template <typename In>
LtCallT<In> WeightGradCall(float* dw, float* dbias_out, const In* dout, const In* inp, int N,
                           int IC, int OC) {
  LtCallT<In> c;
  c.ta = CUBLAS_OP_N, c.tb = CUBLAS_OP_T;
  c.m = OC, c.n = IC, c.k = N;
  c.a = dout, c.lda = OC, c.b = inp, c.ldb = IC;
  c.d = dw, c.d_type = CUDA_R_32F, c.ldd = OC, c.beta = 1.0f;
  c.epilogue = CUBLASLT_EPILOGUE_BGRADA;
  c.bias = dbias_out, c.bias_type = CUDA_R_32F;
  return c;
}

// dpre[N,IC] = gelu'(pre) ⊙ (dout[N,OC] · wᵀ) (w [IC,OC]; DGELU, bf16, written): dpreᵀ (IC×N) =
// (w as col-major OC×IC)ᵀ · doutᵀ (OC×N).
template <typename In>
LtCallT<In> DgeluCall(void* dpre, const void* pre, const In* dout, const In* w, int N, int IC,
                      int OC) {
  LtCallT<In> c;
  c.ta = CUBLAS_OP_T, c.tb = CUBLAS_OP_N;
  c.m = IC, c.n = N, c.k = OC;
  c.a = w, c.lda = OC, c.b = dout, c.ldb = OC;
  c.d = dpre, c.d_type = CUDA_R_16BF, c.ldd = IC;
  c.epilogue = CUBLASLT_EPILOGUE_DGELU;
  c.aux = const_cast<void*>(pre), c.aux_ld = IC;  // read only (DGELU's input)
  return c;
}

}  // namespace strata::model::cuda_ops
