// The cuBLASLt calls of the linear layers on the CPU, without a GPU: the descriptions of
// gpt2_cuda_matmul_plan.h (the ones gpt2_cuda_matmul.cc hands to cublasLtMatmul) run through a
// host emulation of cuBLASLt's column-major product and its BIAS, GELU_AUX_BIAS, DGELU and
// BGRADA epilogues, in fp32, against the CPU reference (model/gpt2_ops.h). A wrong transpose,
// leading dimension or bias orientation shows as a large error.
//
// Run: ctest --test-dir build/release -R MatmulPlan
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "model/cuda/gpt2_cuda_matmul_plan.h"
#include "model/gpt2_ops.h"

namespace strata::model::cuda_ops {
namespace {

float Gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}
float GeluGrad(float x) {
  const float th = std::tanh(0.7978845608f * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

// cublasLtMatmul as documented, every buffer fp32.
void EmulateLt(const LtCallT<float>& c) {
  float* D = static_cast<float*>(c.d);
  float* aux = static_cast<float*>(c.aux);
  const float* bias = static_cast<const float*>(c.bias);
  auto A = [&](int i, int l) {
    return c.ta == CUBLAS_OP_N ? c.a[i + size_t(l) * c.lda] : c.a[l + size_t(i) * c.lda];
  };
  auto B = [&](int l, int j) {
    return c.tb == CUBLAS_OP_N ? c.b[l + size_t(j) * c.ldb] : c.b[j + size_t(l) * c.ldb];
  };
  for (int j = 0; j < c.n; ++j) {
    for (int i = 0; i < c.m; ++i) {
      double acc = 0;
      for (int l = 0; l < c.k; ++l) acc += double(A(i, l)) * B(l, j);
      float x = float(c.alpha * acc) + (c.beta != 0 ? c.beta * D[i + size_t(j) * c.ldd] : 0.0f);
      switch (c.epilogue) {
        case CUBLASLT_EPILOGUE_BIAS:
          x += bias[i];
          break;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
          x += bias[i];
          aux[i + size_t(j) * c.aux_ld] = x;
          x = Gelu(x);
          break;
        case CUBLASLT_EPILOGUE_DGELU:
          x *= GeluGrad(aux[i + size_t(j) * c.aux_ld]);
          break;
        default:
          break;
      }
      D[i + size_t(j) * c.ldd] = x;
    }
  }
  if (c.epilogue == CUBLASLT_EPILOGUE_BGRADA) {
    float* grad = static_cast<float*>(const_cast<void*>(c.bias));
    for (int i = 0; i < c.m; ++i) {
      double s = 0;
      for (int l = 0; l < c.k; ++l) s += A(i, l);
      grad[i] = float(s);
    }
  }
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.0f + std::fabs(ref[i]))) << what << " " << i;
  }
}

class MatmulPlanTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(MatmulPlanTest, MatchesTheCpuReference) {
  const auto [N, IC, OC] = GetParam();
  std::mt19937 rng(N * 7 + IC * 3 + OC);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const auto inp = random(size_t(N) * IC), w = random(size_t(IC) * OC), bias = random(OC);

  // Forward with bias, and with bias + GELU.
  std::vector<float> ref(size_t(N) * OC), gelu_ref(ref.size());
  MatmulForward<float>(ref.data(), inp.data(), w.data(), bias.data(), N, IC, OC);
  GeluForward<float>(gelu_ref.data(), ref.data(), ref.size());
  std::vector<float> out(ref.size()), pre(ref.size());
  EmulateLt(
      LinearForwardCall<float>(out.data(), nullptr, inp.data(), w.data(), bias.data(), N, IC, OC));
  ExpectNear(out, ref, "bias");
  EmulateLt(LinearForwardCall<float>(out.data(), pre.data(), inp.data(), w.data(), bias.data(), N,
                                     IC, OC));
  ExpectNear(pre, ref, "gelu pre");
  ExpectNear(out, gelu_ref, "gelu out");

  // dw (accumulated onto a non-zero start) and dbias (written).
  const auto dout = random(size_t(N) * OC), dw0 = random(size_t(IC) * OC);
  std::vector<float> dw_ref = dw0, db_ref(OC, 0.0f);
  MatmulBackward<float>(nullptr, dw_ref.data(), db_ref.data(), dout.data(), inp.data(), w.data(), N,
                        IC, OC);
  std::vector<float> dw = dw0, db(OC, 123.0f);
  EmulateLt(WeightGradCall<float>(dw.data(), db.data(), dout.data(), inp.data(), N, IC, OC));
  ExpectNear(dw, dw_ref, "dw");
  ExpectNear(db, db_ref, "dbias");

  // The layer before: dpre[N,IC] = gelu'(pre) ⊙ (dout · wᵀ), pre [N,IC].
  const auto pre_in = random(size_t(N) * IC);
  std::vector<float> dlin(size_t(N) * IC, 0.0f), dpre_ref(dlin.size(), 0.0f);
  MatmulBackward<float>(dlin.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), N, IC, OC);
  GeluBackward<float>(dpre_ref.data(), pre_in.data(), dlin.data(), dlin.size());
  std::vector<float> dpre(dlin.size());
  EmulateLt(DgeluCall<float>(dpre.data(), pre_in.data(), dout.data(), w.data(), N, IC, OC));
  ExpectNear(dpre, dpre_ref, "dgelu");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulPlanTest,
                         ::testing::Values(std::tuple{1, 1, 1}, std::tuple{5, 3, 7},
                                           std::tuple{17, 32, 128}, std::tuple{9, 64, 16}));

// RunLt asks cuBLASLt's heuristic once per LtAlgoKey: the key must hold everything the
// heuristic sees (shapes, leading dimensions, types, epilogue, the alignments promised) and
// nothing else, so buffers at other addresses with the same alignment share an algorithm,
// and any call the heuristic could answer differently gets its own.
TEST(LtAlgoKeyTest, HoldsWhatTheHeuristicSeesAndNotTheAddresses) {
  alignas(64) static float buf[4096];
  auto call = [&](int offset) {
    return LinearForwardCall<float>(buf + offset, nullptr, buf + 1024 + offset, buf + 2048 + offset,
                                    buf + 3072, 8, 16, 32);
  };
  EXPECT_EQ(LtAlignmentOf(nullptr), 16u);
  EXPECT_EQ(LtAlignmentOf(buf + 1), 4u);
  EXPECT_EQ(LtAlignmentOf(buf + 2), 8u);
  // Other addresses, the same alignments: one key.
  EXPECT_EQ(LtAlgoKeyOf(call(0)), LtAlgoKeyOf(call(4)));
  EXPECT_EQ(LtAlgoKeyOf(call(0)), LtAlgoKeyOf(call(64)));
  // Another alignment, shape, leading dimension, epilogue, bias or output type: another key.
  EXPECT_NE(LtAlgoKeyOf(call(0)), LtAlgoKeyOf(call(1)));
  auto base = call(0);
  auto shape = base;
  shape.n += 1;
  auto ld = base;
  ld.ldd += 8;
  auto epilogue = base;
  epilogue.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  auto no_bias = base;
  no_bias.bias = nullptr;
  auto out_type = base;
  out_type.d_type = CUDA_R_32F;
  auto aux = base;
  aux.aux = buf;
  aux.aux_ld = 32;
  for (const auto& other : {shape, ld, epilogue, no_bias, out_type, aux}) {
    EXPECT_NE(LtAlgoKeyOf(base), LtAlgoKeyOf(other));
  }
}

}  // namespace
}  // namespace strata::model::cuda_ops
