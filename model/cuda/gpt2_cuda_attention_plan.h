// The index math of the cuBLAS attention (gpt2_cuda_attention_gemm.cu) as plain functions, so
// that a CPU test can run the same GEMM descriptions and head copies through a host emulation
// of cuBLAS's column-major semantics and check them against the CPU reference
// (tests/model/cuda/attention_plan_test.cc) on a machine without a GPU.
//
// Layout: q, k, v, dout and the gradients are head-major [B·NH, T, hs] (one head's [T, hs]
// block after another); the scores S, P, dP, dS are [heads, T, T], row t of a head = query t.
// cuBLAS is column-major, so a row-major [R, K] block is the column-major K×R matrix (its
// transpose): S (row-major [T,T] = column-major Sᵀ) = σ Q Kᵀ is computed as Sᵀ = σ K Qᵀ with
// A = K (stored hs×T, op T), B = Q (stored hs×T, op N), m = n = T, k = hs; the others below.
//
// Internal to model/cuda/. Header-only; needs cuBLAS's enums only.
#pragma once

#include <cublas_api.h>

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::model::cuda_ops {

struct AttentionDims {
  int B, T, C, NH, hs;
  STRATA_HOST_DEVICE int64_t BH() const { return int64_t(B) * NH; }
};

// Element chunk i (kVec values) of a walk over the head-major [B·NH, T, hs]: its offset there,
// and the offset of the same values in an interleaved [B, T, stride] tensor whose head h
// starts at channel h·hs (qkv with stride 3C plus C or 2C for k, v; out/dout with stride C).
struct HeadIndex {
  size_t head_major;
  size_t interleaved;
};
template <int kVec>
STRATA_HOST_DEVICE inline HeadIndex LocateHead(int64_t i, const AttentionDims& d, int64_t stride) {
  const int chunks = d.hs / kVec;
  const int c = static_cast<int>(i % chunks);
  const int64_t row = i / chunks;  // (b·NH + h)·T + t
  const int t = static_cast<int>(row % d.T);
  const int64_t bh = row / d.T;
  const int h = static_cast<int>(bh % d.NH);
  const int64_t b = bh / d.NH;
  return {size_t(row) * d.hs + size_t(c) * kVec,
          size_t(b * d.T + t) * size_t(stride) + size_t(h) * d.hs + size_t(c) * kVec};
}

// One cublasGemmStridedBatchedEx call: column-major C(m×n) = alpha·op(A)·op(B) (beta 0) for
// `batch` problems, each operand advancing by its stride.
template <typename In, typename Out>
struct StridedGemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  float alpha;
  const In* a;
  int lda;
  int64_t stride_a;
  const In* b;
  int ldb;
  int64_t stride_b;
  Out* c;
  int ldc;
  int64_t stride_c;
  int64_t batch;
};

// The six products of `heads` heads starting at the given head-major / score pointers.
// Forward: S = σ Q Kᵀ, O = P V. Backward: dV = Pᵀ dO, dP = dO Vᵀ, dQ = σ dS K, dK = σ dSᵀ Q.
template <typename In, typename Out>
StridedGemm<In, Out> ScoresGemm(int T, int hs, float scale, const In* q, const In* k, Out* s,
                                int64_t heads) {
  const int64_t h = int64_t(T) * hs, t2 = int64_t(T) * T;
  return {CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, hs, h, q, hs, h, s, T, t2, heads};
}
// Oᵀ (hs×T) = V (stored hs×T) · P (stored as Pᵀ, op N).
template <typename In, typename Out>
StridedGemm<In, Out> ValuesGemm(int T, int hs, const In* p, const In* v, Out* o, int64_t heads) {
  const int64_t h = int64_t(T) * hs, t2 = int64_t(T) * T;
  return {CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, hs, h, p, T, t2, o, hs, h, heads};
}
// dVᵀ (hs×T) = dO (stored hs×T) · P (stored as Pᵀ, op T: P itself).
template <typename In, typename Out>
StridedGemm<In, Out> ValueGradGemm(int T, int hs, const In* p, const In* dout, Out* dv,
                                   int64_t heads) {
  const int64_t h = int64_t(T) * hs, t2 = int64_t(T) * T;
  return {CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dout, hs, h, p, T, t2, dv, hs, h, heads};
}
// dP = dO Vᵀ: ScoresGemm's shape with Q -> dO, K -> V and no scale.
template <typename In, typename Out>
StridedGemm<In, Out> ProbGradGemm(int T, int hs, const In* dout, const In* v, Out* dp,
                                  int64_t heads) {
  return ScoresGemm<In, Out>(T, hs, 1.0f, dout, v, dp, heads);
}
// dQᵀ (hs×T) = σ K (stored hs×T) · dS (stored as dSᵀ, op N).
template <typename In, typename Out>
StridedGemm<In, Out> QueryGradGemm(int T, int hs, float scale, const In* ds, const In* k, Out* dq,
                                   int64_t heads) {
  const int64_t h = int64_t(T) * hs, t2 = int64_t(T) * T;
  return {CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, hs, h, ds, T, t2, dq, hs, h, heads};
}
// dKᵀ (hs×T) = σ Q (stored hs×T) · dS (stored as dSᵀ, op T: dS itself).
template <typename In, typename Out>
StridedGemm<In, Out> KeyGradGemm(int T, int hs, float scale, const In* ds, const In* q, Out* dk,
                                 int64_t heads) {
  const int64_t h = int64_t(T) * hs, t2 = int64_t(T) * T;
  return {CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, hs, h, ds, T, t2, dk, hs, h, heads};
}

}  // namespace strata::model::cuda_ops
