// GPU tests of issue 44's review fixes (built into model_gpt2_cuda_ops_test, which
// tools/gpu_check.sh runs; each skips without a GPU):
//   - the aliasing rules of ResidualLayerNormForward and MatmulDgeluBackward are checked
//     (InvalidArgument), not only documented;
//   - the sorted embedding backward with one token filling the batch (padding, end-of-text):
//     the run's end found by a binary search, the same bits as the V-block kernel, and the
//     CPU's sums.
// The flash attention's padded shared-memory rows are covered by GpuOpsTest.Attention's flash
// variant (gpt2_cuda_ops_test.cc).
//
// Run: ctest --test-dir build/release -R 'ReviewGpuTest'
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/cuda/gpt2_cuda_ops.h"
#include "model/gpt2_ops.h"

namespace strata::model::cuda_ops {
namespace {

template <typename T>
struct DeviceArray {
  explicit DeviceArray(size_t n) : n(n) {
    if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* p = nullptr;
  size_t n;
};

class ReviewGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device present";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    auto ctx = CudaOpContext::Create(stream_);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(ctx).value();
  }
  void TearDown() override {
    ctx_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  template <typename T>
  void Put(DeviceArray<T>& d, const std::vector<T>& h) {
    ASSERT_EQ(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <typename T>
  std::vector<T> Get(const DeviceArray<T>& d) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<T> h(d.n);
    EXPECT_EQ(cudaMemcpy(h.data(), d.p, h.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaOpContext> ctx_;
};

// out may not overlap res, a or b (the kernel reads the residual row after writing out);
// res may alias a or b.
TEST_F(ReviewGpuTest, ResidualLayerNormRefusesAliasedOutput) {
  const int N = 4, C = 64;
  const size_t nc = size_t(N) * C;
  DeviceArray<Bf16> a(nc), b(nc), res(nc), out(nc), w(C), bias(C);
  DeviceArray<float> mean(N), rstd(N);
  ASSERT_EQ(cudaMemset(a.p, 0, nc * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(b.p, 0, nc * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(w.p, 0, C * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(bias.p, 0, C * 2), cudaSuccess);
  for (const char* spec : {"tuned", "naive"}) {
    SCOPED_TRACE(spec);
    ctx_->set_kernels(*KernelChoice::Parse(spec));
    for (Bf16* bad_out : {res.p, a.p, b.p, res.p + C}) {
      EXPECT_EQ(ResidualLayerNormForward(*ctx_, res.p, bad_out, mean.p, rstd.p, a.p, b.p, w.p,
                                         bias.p, N, C)
                    .code(),
                StatusCode::kInvalidArgument);
    }
    EXPECT_TRUE(
        ResidualLayerNormForward(*ctx_, a.p, out.p, mean.p, rstd.p, a.p, b.p, w.p, bias.p, N, C)
            .ok());
  }
}

// dpre may not overlap scratch, dout or pre (it is overwritten while they are read).
TEST_F(ReviewGpuTest, MatmulDgeluRefusesAliasedGradient) {
  const int N = 8, IC = 64, OC = 32;
  DeviceArray<Bf16> dpre(size_t(N) * IC), scratch(size_t(N) * IC), dout(size_t(N) * OC),
      pre(size_t(N) * IC), w(size_t(IC) * OC);
  for (auto* d : {&dpre, &scratch, &dout, &pre, &w}) {
    ASSERT_EQ(cudaMemset(d->p, 0, d->n * 2), cudaSuccess);
  }
  for (const char* spec : {"tuned", "naive"}) {
    SCOPED_TRACE(spec);
    ctx_->set_kernels(*KernelChoice::Parse(spec));
    EXPECT_EQ(
        MatmulDgeluBackward(*ctx_, scratch.p, scratch.p, dout.p, pre.p, w.p, N, IC, OC).code(),
        StatusCode::kInvalidArgument);
    EXPECT_EQ(MatmulDgeluBackward(*ctx_, pre.p, scratch.p, dout.p, pre.p, w.p, N, IC, OC).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(MatmulDgeluBackward(*ctx_, dout.p, scratch.p, dout.p, pre.p, w.p, N, IC, OC).code(),
              StatusCode::kInvalidArgument);
    EXPECT_TRUE(MatmulDgeluBackward(*ctx_, dpre.p, scratch.p, dout.p, pre.p, w.p, N, IC, OC).ok());
  }
}

// One token filling the whole batch, and a batch that is mostly one token (padding) with a
// few others: the sorted kernel gives the bits of the V-block kernel and of the CPU's sums in
// ascending position order (within fp32 rounding of the CPU's sums).
TEST_F(ReviewGpuTest, EmbeddingBackwardWithOneTokenFillingTheBatch) {
  const int B = 8, T = 1024, C = 768, V = 50257;
  const size_t N = size_t(B) * T;
  std::mt19937 rng(44);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Bf16> dout_h(N * C);
  std::vector<float> dout_f(N * C);
  for (size_t i = 0; i < dout_h.size(); ++i) {
    dout_h[i] = __float2bfloat16(normal(rng));
    dout_f[i] = __bfloat162float(dout_h[i]);
  }
  DeviceArray<Bf16> dout(N * C);
  Put(dout, dout_h);
  for (int mixed = 0; mixed < 2; ++mixed) {
    SCOPED_TRACE(mixed ? "mostly token 50256" : "only token 50256");
    std::vector<int32_t> tokens(N, 50256);
    if (mixed) {
      for (size_t i = 0; i < N; i += 97) tokens[i] = int32_t(i % 1000);
    }
    DeviceArray<int32_t> d_tokens(N);
    Put(d_tokens, tokens);
    std::vector<std::vector<float>> got;
    for (const char* spec : {"embedding=tuned", "embedding=naive"}) {
      ctx_->set_kernels(*KernelChoice::Parse(spec));
      DeviceArray<float> dwte(size_t(V) * C);
      ASSERT_EQ(cudaMemset(dwte.p, 0, dwte.n * sizeof(float)), cudaSuccess);
      ASSERT_TRUE(EmbeddingBackward(*ctx_, dwte.p, nullptr, dout.p, d_tokens.p, B, T, C, V).ok());
      got.push_back(Get(dwte));
    }
    std::vector<float> ref(size_t(V) * C, 0.0f), dwpe(size_t(T) * C, 0.0f);
    model::EmbeddingBackward<float>(ref.data(), dwpe.data(), dout_f.data(), tokens.data(), B, T, C);
    EXPECT_TRUE(got[0] == got[1]) << "the sorted and V-block kernels differ in bits";
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (!(std::fabs(got[0][i] - ref[i]) <= 1e-4f * std::fabs(ref[i]) + 1e-4f)) ++bad;
    }
    EXPECT_EQ(bad, 0u) << "elements of the sorted kernel's dwte off the CPU's sums";
  }
}

}  // namespace
}  // namespace strata::model::cuda_ops
