// The cuBLAS attention's index math on the CPU, without a GPU: the GEMM descriptions and the
// head copies of gpt2_cuda_attention_plan.h (the ones gpt2_cuda_attention_gemm.cu hands to
// cublasGemmStridedBatchedEx and its copy kernels) run through a host emulation of cuBLAS's
// column-major semantics, with the softmax steps written as the kernels compute them, in fp32;
// the results must match the CPU reference (model/gpt2_ops.h) to fp32 rounding. A wrong
// transpose, leading dimension, stride or head offset shows as a large error here.
//
// Run: ctest --test-dir build/release -R AttentionPlan
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/cuda/gpt2_cuda_attention_plan.h"
#include "model/gpt2_ops.h"

namespace strata::model::cuda_ops {
namespace {

// cublasGemmStridedBatchedEx with beta = 0, column-major: C[i + j·ldc] = alpha Σ_l
// opA(i,l) opB(l,j), opA(i,l) = A[i + l·lda] (N) or A[l + i·lda] (T), likewise B.
void EmulateGemm(const StridedGemm<float, float>& g) {
  for (int64_t b = 0; b < g.batch; ++b) {
    const float* A = g.a + b * g.stride_a;
    const float* B = g.b + b * g.stride_b;
    float* C = g.c + b * g.stride_c;
    for (int j = 0; j < g.n; ++j) {
      for (int i = 0; i < g.m; ++i) {
        double acc = 0;
        for (int l = 0; l < g.k; ++l) {
          const float a = g.ta == CUBLAS_OP_N ? A[i + size_t(l) * g.lda] : A[l + size_t(i) * g.lda];
          const float x = g.tb == CUBLAS_OP_N ? B[l + size_t(j) * g.ldb] : B[j + size_t(l) * g.ldb];
          acc += double(a) * x;
        }
        C[i + size_t(j) * g.ldc] = float(g.alpha * acc);
      }
    }
  }
}

// The head copies as the kernels do them (kVec = 1; kVec = 8 is checked to address the same
// elements).
void Split(std::vector<float>* dst, const float* src, int64_t stride, const AttentionDims& d) {
  for (int64_t i = 0; i < d.BH() * d.T * d.hs; ++i) {
    const HeadIndex x = LocateHead<1>(i, d, stride);
    (*dst)[x.head_major] = src[x.interleaved];
  }
}

struct Shape {
  int B, T, C, NH;
  int64_t heads_per_batch;
};

class AttentionPlanTest : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionPlanTest, MatchesTheCpuReference) {
  const Shape sh = GetParam();
  const int B = sh.B, T = sh.T, C = sh.C, NH = sh.NH, hs = C / NH;
  const AttentionDims d{B, T, C, NH, hs};
  const int64_t BH = d.BH(), per_batch = sh.heads_per_batch;
  const size_t N = size_t(B) * T, nc = N * C, tt = size_t(T) * T;
  const float scale = 1.0f / std::sqrt(float(hs));
  std::mt19937 rng(B * 1000 + T * 10 + NH);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> qkv(3 * nc), dout(nc);
  for (float& x : qkv) x = dist(rng);
  for (float& x : dout) x = dist(rng);

  // CPU reference.
  std::vector<float> out_ref(nc), att(size_t(BH) * tt), dqkv_ref(3 * nc, 0.0f);
  AttentionForward<float>(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
  AttentionBackward<float>(dqkv_ref.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

  // The 8-wide head copies address the same elements as eight 1-wide ones.
  if (hs % 8 == 0) {
    for (int64_t i = 0; i < BH * T * hs / 8; ++i) {
      const HeadIndex a = LocateHead<8>(i, d, 3 * C), b = LocateHead<1>(8 * i, d, 3 * C);
      ASSERT_EQ(a.head_major, b.head_major) << i;
      ASSERT_EQ(a.interleaved, b.interleaved) << i;
    }
  }

  // Emulated forward, in batches of heads as the .cu walks them.
  std::vector<float> q(nc), k(nc), v(nc), o(nc), dO(nc), lse(size_t(BH) * T);
  Split(&q, qkv.data(), 3 * C, d);
  Split(&k, qkv.data() + C, 3 * C, d);
  Split(&v, qkv.data() + 2 * C, 3 * C, d);
  Split(&dO, dout.data(), C, d);
  std::vector<float> S(size_t(per_batch) * tt), P(S.size()), dS(S.size());
  const int64_t h_stride = int64_t(T) * hs;
  for (int64_t h0 = 0; h0 < BH; h0 += per_batch) {
    const int64_t n = std::min(per_batch, BH - h0);
    const size_t off = size_t(h0) * h_stride;
    EmulateGemm(
        ScoresGemm<float, float>(T, hs, scale, q.data() + off, k.data() + off, S.data(), n));
    for (int64_t r = 0; r < n * T; ++r) {  // CausalSoftmaxKernel
      const int t = int(r % T);
      const float* s = S.data() + r * T;
      float mx = -INFINITY, sum = 0;
      for (int j = 0; j <= t; ++j) mx = std::max(mx, s[j]);
      for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - mx);
      for (int j = 0; j < T; ++j) P[r * T + j] = j <= t ? std::exp(s[j] - mx) / sum : 0.0f;
      lse[h0 * T + r] = mx + std::log(sum);
    }
    EmulateGemm(ValuesGemm<float, float>(T, hs, P.data(), v.data() + off, o.data() + off, n));
  }
  std::vector<float> out(nc);
  for (int64_t i = 0; i < BH * T * hs; ++i) {  // MergeHeadsKernel
    const HeadIndex x = LocateHead<1>(i, d, C);
    out[x.interleaved] = o[x.head_major];
  }
  for (size_t i = 0; i < nc; ++i) {
    ASSERT_NEAR(out[i], out_ref[i], 1e-4f * (1.0f + std::fabs(out_ref[i]))) << "out " << i;
  }

  // Emulated backward.
  std::vector<float> dq(nc), dk(nc), dv(nc);
  for (int64_t h0 = 0; h0 < BH; h0 += per_batch) {
    const int64_t n = std::min(per_batch, BH - h0);
    const size_t off = size_t(h0) * h_stride;
    EmulateGemm(
        ScoresGemm<float, float>(T, hs, scale, q.data() + off, k.data() + off, S.data(), n));
    for (int64_t i = 0; i < n * T * T; ++i) {  // CausalProbsKernel
      const int64_t r = i / T;
      P[i] = (i % T) <= (r % T) ? std::exp(S[i] - lse[h0 * T + r]) : 0.0f;
    }
    EmulateGemm(ValueGradGemm<float, float>(T, hs, P.data(), dO.data() + off, dv.data() + off, n));
    EmulateGemm(ProbGradGemm<float, float>(T, hs, dO.data() + off, v.data() + off, S.data(), n));
    for (int64_t r = 0; r < n * T; ++r) {  // CausalSoftmaxBackwardKernel
      const int t = int(r % T);
      float D = 0;
      for (int j = 0; j <= t; ++j) D += P[r * T + j] * S[r * T + j];
      for (int j = 0; j < T; ++j) {
        dS[r * T + j] = j <= t ? P[r * T + j] * (S[r * T + j] - D) : 0.0f;
      }
    }
    EmulateGemm(
        QueryGradGemm<float, float>(T, hs, scale, dS.data(), k.data() + off, dq.data() + off, n));
    EmulateGemm(
        KeyGradGemm<float, float>(T, hs, scale, dS.data(), q.data() + off, dk.data() + off, n));
  }
  std::vector<float> dqkv(3 * nc, 0.0f);
  const std::vector<float>* grads[3] = {&dq, &dk, &dv};
  for (int part = 0; part < 3; ++part) {  // AddHeadsKernel
    for (int64_t i = 0; i < BH * T * hs; ++i) {
      const HeadIndex x = LocateHead<1>(i, d, 3 * C);
      dqkv[size_t(part) * C + x.interleaved] += (*grads[part])[x.head_major];
    }
  }
  double sq = 0;
  for (float r : dqkv_ref) sq += double(r) * r;
  const double rms = std::sqrt(sq / dqkv_ref.size());
  for (size_t i = 0; i < dqkv.size(); ++i) {
    ASSERT_NEAR(dqkv[i], dqkv_ref[i], 1e-4 * rms + 1e-4 * std::fabs(dqkv_ref[i])) << "dqkv " << i;
  }
}

// Odd T, several heads and batch rows, one head per GEMM batch and all heads in one, and the
// 8-wide copies (hs = 16, 32).
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionPlanTest,
                         ::testing::Values(Shape{1, 1, 1, 1, 1}, Shape{2, 17, 48, 3, 6},
                                           Shape{2, 17, 48, 3, 1}, Shape{1, 33, 64, 4, 3},
                                           Shape{3, 9, 96, 3, 4}));

}  // namespace
}  // namespace strata::model::cuda_ops
