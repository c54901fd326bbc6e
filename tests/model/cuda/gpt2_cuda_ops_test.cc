// The CUDA GPT-2 ops (model/cuda/gpt2_cuda_ops.h) against the CPU fp32 path
// (model/gpt2_ops.h): every op's forward and backward on random inputs, a whole transformer
// block forward and backward, and bitwise run-to-run determinism.
//
// Inputs are drawn in fp32, rounded to bf16 and uploaded; the CPU reference runs on the same
// rounded values, so the differences measured are the GPU path's own (bf16 outputs and
// intermediates, fp32 accumulation in another order). Tolerance per element:
// |gpu - ref| <= atol + rtol·|ref| with rtol 1e-2 for single ops and the whole block, and atol a
// small fraction of the reference's RMS (gradients that are sums of many terms can cancel to
// near zero). The rtols are measured, not guessed: on an H200 (2026-12-01) the largest rtol any
// comparison needed was 4.6e-3 for a single op (cross-entropy dlogits; most ops 1e-3 or less)
// and 2.3e-3 for the whole block (attn.c_attn.weight's gradient). Each comparison prints its
// own figure as a "[tolerance]" line, which tools/gpu_check.sh collects.
//
// Needs a GPU: every test skips (GTEST_SKIP) where cudaGetDeviceCount finds none.
// Run: cmake --build build/cuda --target model_gpt2_cuda_ops_test &&
//      ctest --test-dir build/cuda -R gpt2_cuda_ops --output-on-failure
#include "model/cuda/gpt2_cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/cuda/gpt2_cuda_block.h"
#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/gpt2_ops.h"

namespace strata::model::cuda_ops {
namespace {

namespace cpu = ::strata::model;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(expr)
#define ASSERT_OK(expr)                      \
  do {                                       \
    ::strata::Status st_ = (expr);           \
    ASSERT_TRUE(st_.ok()) << st_.ToString(); \
  } while (0)

float RoundBf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// A device buffer of T; freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }

 private:
  void* ptr_ = nullptr;
  size_t count_;
};

class GpuOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    auto ctx = CudaOpContext::Create(stream_);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(ctx).value();
    // The tuned kernels, whatever the default (docs/gpu_record.md): tests that compare them
    // with the previous ones set those explicitly.
    ctx_->set_kernels(KernelChoice{});
  }
  void TearDown() override {
    ctx_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // n values from N(0, scale²), already rounded to bf16.
  std::vector<float> Random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = RoundBf16(dist(rng_));
    return v;
  }
  std::vector<int32_t> RandomTokens(size_t n, int V) {
    std::uniform_int_distribution<int32_t> dist(0, V - 1);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = dist(rng_);
    return v;
  }

  std::unique_ptr<DeviceBuffer<Bf16>> UploadBf16(const std::vector<float>& host) {
    std::vector<Bf16> tmp(host.size());
    for (size_t i = 0; i < host.size(); ++i) tmp[i] = __float2bfloat16(host[i]);
    auto buf = std::make_unique<DeviceBuffer<Bf16>>(host.size());
    EXPECT_NE(buf->get(), nullptr);
    EXPECT_EQ(cudaMemcpy(buf->get(), tmp.data(), tmp.size() * sizeof(Bf16), cudaMemcpyHostToDevice),
              cudaSuccess);
    return buf;
  }
  template <typename T>
  std::unique_ptr<DeviceBuffer<T>> Upload(const std::vector<T>& host) {
    auto buf = std::make_unique<DeviceBuffer<T>>(host.size());
    EXPECT_NE(buf->get(), nullptr);
    EXPECT_EQ(cudaMemcpy(buf->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return buf;
  }
  std::vector<float> DownloadBf16(const DeviceBuffer<Bf16>& buf) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<Bf16> tmp(buf.size());
    EXPECT_EQ(cudaMemcpy(tmp.data(), buf.get(), tmp.size() * sizeof(Bf16), cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<float> out(tmp.size());
    for (size_t i = 0; i < tmp.size(); ++i) out[i] = __bfloat162float(tmp[i]);
    return out;
  }
  template <typename T>
  std::vector<T> Download(const DeviceBuffer<T>& buf) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<T> out(buf.size());
    EXPECT_EQ(cudaMemcpy(out.data(), buf.get(), out.size() * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

  // Element-wise |got - ref| <= atol + rtol·|ref| with atol = atol_rms · RMS(ref); reports
  // the number of violations, the worst few and the seed.
  void ExpectClose(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& ref, float rtol = 1e-2f, float atol_rms = 1e-2f) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    double sq = 0.0;
    for (float r : ref) sq += double(r) * r;
    const double rms = ref.empty() ? 0.0 : std::sqrt(sq / ref.size());
    const double atol = atol_rms * rms + 1e-6;
    size_t bad = 0;
    std::string first;
    double needed_rtol = 0.0;  // the smallest rtol that passes with this atol
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = std::fabs(double(got[i]) - ref[i]);
      if (err > atol) needed_rtol = std::max(needed_rtol, (err - atol) / std::fabs(ref[i]));
      if (!(err <= atol + rtol * std::fabs(ref[i]))) {  // NaN counts as a violation
        if (++bad <= 5) {
          first += " [" + std::to_string(i) + "] gpu=" + std::to_string(got[i]) +
                   " ref=" + std::to_string(ref[i]);
        }
      }
    }
    // One line per comparison, read by tools/gpu_check.sh: the measured error against the
    // tolerance this test allows.
    std::printf("[tolerance] %s needed_rtol=%.3g rtol=%.3g atol=%.3g n=%zu\n", what.c_str(),
                needed_rtol, double(rtol), atol, ref.size());
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                       << " elements out of tolerance (rtol=" << rtol << " atol=" << atol
                       << ", rms(ref)=" << rms << ", seed=" << seed_ << "):" << first;
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaOpContext> ctx_;
};

// KernelChoice's grammar and defaults, and the workspace sizes: kernel_choice_test.cc (no GPU).

TEST_F(GpuOpsTest, Conversions) {
  const std::vector<float> host = {0.0f, 1.0f, -1.5f, 3.14159265f, 1e-3f, -65504.0f, 1e30f};
  auto f = Upload(host);
  DeviceBuffer<Bf16> b(host.size());
  DeviceBuffer<float> back(host.size());
  ASSERT_OK(ConvertF32ToBf16(*ctx_, b.get(), f->get(), host.size()));
  ASSERT_OK(ConvertBf16ToF32(*ctx_, back.get(), b.get(), host.size()));
  const std::vector<float> got = Download(back);
  for (size_t i = 0; i < host.size(); ++i) EXPECT_EQ(got[i], RoundBf16(host[i])) << i;
}

TEST_F(GpuOpsTest, Embedding) {
  for (auto [B, T, C, V] : {std::tuple{1, 1, 1, 1}, std::tuple{3, 17, 33, 50},
                            std::tuple{2, 64, 1100, 7}, std::tuple{4, 256, 64, 50257}}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                 " V=" + std::to_string(V));
    const size_t N = size_t(B) * T;
    auto tokens = RandomTokens(N, V);
    auto wte = Random(size_t(V) * C, 0.5f), wpe = Random(size_t(T) * C, 0.5f);
    std::vector<float> out_ref(N * C);
    cpu::EmbeddingForward<float>(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    auto d_tokens = Upload(tokens);
    auto d_wte = UploadBf16(wte), d_wpe = UploadBf16(wpe);
    DeviceBuffer<Bf16> d_out(N * C);
    ASSERT_OK(
        EmbeddingForward(*ctx_, d_out.get(), d_tokens->get(), d_wte->get(), d_wpe->get(), B, T, C));
    ExpectClose("embedding out", DownloadBf16(d_out), out_ref);

    // Backward accumulates into non-zero gradients.
    auto dout = Random(N * C);
    auto dwte_ref = Random(size_t(V) * C), dwpe_ref = Random(size_t(T) * C);
    auto d_dwte = Upload(dwte_ref), d_dwpe = Upload(dwpe_ref);
    auto d_dout = UploadBf16(dout);
    cpu::EmbeddingBackward<float>(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), B,
                                  T, C);
    // The sort + segmented sum (default) and the V-block kernel (naive) from the same start:
    // the same bits, since both sum each row's positions in ascending order.
    auto d_dwte_naive = Upload(std::vector<float>(Download(*d_dwte)));
    ASSERT_OK(EmbeddingBackward(*ctx_, d_dwte->get(), d_dwpe->get(), d_dout->get(), d_tokens->get(),
                                B, T, C, V));
    KernelChoice naive;
    naive.naive_embedding = true;
    ctx_->set_kernels(naive);
    ASSERT_OK(EmbeddingBackward(*ctx_, d_dwte_naive->get(), nullptr, d_dout->get(), d_tokens->get(),
                                B, T, C, V));
    ctx_->set_kernels(KernelChoice{});
    // fp32 gradients from bf16 inputs: only the summation order differs.
    const std::vector<float> dwte = Download(*d_dwte), dwte_naive = Download(*d_dwte_naive);
    ExpectClose("embedding dwte", dwte, dwte_ref, 1e-4f, 1e-4f);
    EXPECT_EQ(std::memcmp(dwte.data(), dwte_naive.data(), dwte.size() * sizeof(float)), 0);
    ExpectClose("embedding dwpe", Download(*d_dwpe), dwpe_ref, 1e-4f, 1e-4f);
  }
}

TEST_F(GpuOpsTest, LayerNorm) {
  for (auto [N, C] : {std::pair{1, 1}, std::pair{17, 15}, std::pair{37, 768}, std::pair{5, 1023}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    auto inp = Random(size_t(N) * C, 2.0f);
    for (int n = 0; n < N; ++n) {  // a per-row offset, as in a residual stream
      for (int c = 0; c < C; ++c) inp[size_t(n) * C + c] = RoundBf16(inp[size_t(n) * C + c] + n);
    }
    auto w = Random(C), b = Random(C);
    std::vector<float> out_ref(size_t(N) * C), mean_ref(N), rstd_ref(N);
    cpu::LayerNormForward<float>(out_ref.data(), mean_ref.data(), rstd_ref.data(), inp.data(),
                                 w.data(), b.data(), N, C);
    auto d_inp = UploadBf16(inp), d_w = UploadBf16(w), d_b = UploadBf16(b);
    DeviceBuffer<Bf16> d_out(size_t(N) * C);
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    ASSERT_OK(LayerNormForward(*ctx_, d_out.get(), d_mean.get(), d_rstd.get(), d_inp->get(),
                               d_w->get(), d_b->get(), N, C));
    ExpectClose("layernorm out", DownloadBf16(d_out), out_ref);
    ExpectClose("layernorm mean", Download(d_mean), mean_ref, 1e-4f, 1e-4f);
    ExpectClose("layernorm rstd", Download(d_rstd), rstd_ref, 1e-3f, 1e-4f);

    auto dout = Random(size_t(N) * C);
    auto dinp_ref = Random(size_t(N) * C), dw_ref = Random(C), db_ref = Random(C);
    auto d_dinp = UploadBf16(dinp_ref);
    auto d_dw = Upload(dw_ref), d_db = Upload(db_ref);
    auto d_dout = UploadBf16(dout);
    cpu::LayerNormBackward<float>(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(),
                                  inp.data(), w.data(), mean_ref.data(), rstd_ref.data(), N, C);
    ASSERT_OK(LayerNormBackward(*ctx_, d_dinp->get(), d_dw->get(), d_db->get(), d_dout->get(),
                                d_inp->get(), d_w->get(), d_mean.get(), d_rstd.get(), N, C));
    ExpectClose("layernorm dinp", DownloadBf16(*d_dinp), dinp_ref);
    ExpectClose("layernorm dw", Download(*d_dw), dw_ref, 2e-3f, 1e-3f);
    ExpectClose("layernorm db", Download(*d_db), db_ref, 1e-4f, 1e-4f);
  }
}

// cuBLASLt with the bias and bias-gradient epilogues (default; odd shapes may fall back to
// cublasGemmEx inside), and cublasGemmEx + the broadcast and column-sum kernels (naive).
TEST_F(GpuOpsTest, Matmul) {
  for (bool naive : {false, true})
    for (auto [N, IC, OC, with_bias] :
         {std::tuple{1, 1, 1, true}, std::tuple{17, 33, 47, true}, std::tuple{64, 128, 384, false},
          std::tuple{129, 256, 1023, true}, std::tuple{256, 64, 256, true}}) {
      KernelChoice k;
      k.naive_matmul = naive;
      ctx_->set_kernels(k);
      SCOPED_TRACE(std::string(naive ? "naive " : "") + "N=" + std::to_string(N) +
                   " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC));
      auto inp = Random(size_t(N) * IC), w = Random(size_t(IC) * OC, 0.1f), bias = Random(OC);
      std::vector<float> out_ref(size_t(N) * OC);
      cpu::MatmulForward<float>(out_ref.data(), inp.data(), w.data(),
                                with_bias ? bias.data() : nullptr, N, IC, OC);
      auto d_inp = UploadBf16(inp), d_w = UploadBf16(w), d_bias = UploadBf16(bias);
      DeviceBuffer<Bf16> d_out(size_t(N) * OC);
      ASSERT_OK(MatmulForward(*ctx_, d_out.get(), d_inp->get(), d_w->get(),
                              with_bias ? d_bias->get() : nullptr, N, IC, OC));
      ExpectClose("matmul out", DownloadBf16(d_out), out_ref);

      auto dout = Random(size_t(N) * OC);
      auto dinp_ref = Random(size_t(N) * IC), dw_ref = Random(size_t(IC) * OC), db_ref = Random(OC);
      auto d_dinp = UploadBf16(dinp_ref);
      auto d_dw = Upload(dw_ref), d_db = Upload(db_ref);
      auto d_dout = UploadBf16(dout);
      cpu::MatmulBackward<float>(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(),
                                 inp.data(), w.data(), N, IC, OC);
      ASSERT_OK(MatmulBackward(*ctx_, d_dinp->get(), d_dw->get(), d_db->get(), d_dout->get(),
                               d_inp->get(), d_w->get(), N, IC, OC));
      ExpectClose("matmul dinp", DownloadBf16(*d_dinp), dinp_ref);
      ExpectClose("matmul dw", Download(*d_dw), dw_ref, 1e-3f, 1e-3f);
      ExpectClose("matmul dbias", Download(*d_db), db_ref, 1e-4f, 1e-4f);
    }
}

// cuBLASLt's heuristic is asked once per call shape: a second call of the same shape on other
// buffers reuses the algorithm (a cache hit), and gives the bits a fresh context gives.
TEST_F(GpuOpsTest, MatmulAlgorithmsAreChosenOncePerShape) {
  const int N = 64, IC = 128, OC = 384;
  auto inp = Random(size_t(N) * IC), w = Random(size_t(IC) * OC, 0.1f), bias = Random(OC);
  auto d_inp = UploadBf16(inp), d_w = UploadBf16(w), d_bias = UploadBf16(bias);
  auto d_inp2 = UploadBf16(inp), d_w2 = UploadBf16(w);
  DeviceBuffer<Bf16> d_out(size_t(N) * OC), d_out2(size_t(N) * OC), d_fresh(size_t(N) * OC);
  ASSERT_OK(MatmulForward(*ctx_, d_out.get(), d_inp->get(), d_w->get(), d_bias->get(), N, IC, OC));
  const uint64_t misses = ctx_->lt_algos().misses, hits = ctx_->lt_algos().hits;
  ASSERT_OK(
      MatmulForward(*ctx_, d_out2.get(), d_inp2->get(), d_w2->get(), d_bias->get(), N, IC, OC));
  EXPECT_EQ(ctx_->lt_algos().misses, misses);
  EXPECT_EQ(ctx_->lt_algos().hits, hits + 1);
  auto fresh = CudaOpContext::Create(stream_);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_OK(
      MatmulForward(**fresh, d_fresh.get(), d_inp->get(), d_w->get(), d_bias->get(), N, IC, OC));
  EXPECT_EQ((*fresh)->lt_algos().hits, 0u);
  const auto a = DownloadBf16(d_out), b = DownloadBf16(d_out2), c = DownloadBf16(d_fresh);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
}

// The fused GELU layer ops against the CPU's matmul + GELU (forward) and matmul backward +
// GELU backward: cuBLASLt's GELU_AUX_BIAS / DGELU epilogues (OC, IC % 8 == 0) and the
// fallbacks (OC = 36: no epilogue; naive: never).
TEST_F(GpuOpsTest, MatmulGelu) {
  for (bool naive : {false, true})
    for (auto [N, IC, OC] :
         {std::tuple{17, 32, 128}, std::tuple{64, 64, 256}, std::tuple{9, 16, 36}}) {
      KernelChoice k;
      k.naive_matmul = naive;
      ctx_->set_kernels(k);
      SCOPED_TRACE(std::string(naive ? "naive " : "") + "N=" + std::to_string(N) +
                   " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC));
      auto inp = Random(size_t(N) * IC), w = Random(size_t(IC) * OC, 0.2f), bias = Random(OC);
      std::vector<float> pre_ref(size_t(N) * OC), out_ref(size_t(N) * OC);
      cpu::MatmulForward<float>(pre_ref.data(), inp.data(), w.data(), bias.data(), N, IC, OC);
      cpu::GeluForward<float>(out_ref.data(), pre_ref.data(), pre_ref.size());
      auto d_inp = UploadBf16(inp), d_w = UploadBf16(w), d_bias = UploadBf16(bias);
      DeviceBuffer<Bf16> d_out(size_t(N) * OC), d_pre(size_t(N) * OC);
      ASSERT_OK(MatmulGeluForward(*ctx_, d_out.get(), d_pre.get(), d_inp->get(), d_w->get(),
                                  d_bias->get(), N, IC, OC));
      ExpectClose("matmul+gelu pre", DownloadBf16(d_pre), pre_ref);
      ExpectClose("matmul+gelu out", DownloadBf16(d_out), out_ref);

      // Backward of the layer after it: dpre[N,IC'] = gelu'(pre) ⊙ (dout · w2ᵀ), with the
      // GELU layer's output width as IC' = OC and a second weight w2 [OC, OC2].
      const int OC2 = 48;
      auto w2 = Random(size_t(OC) * OC2, 0.2f), dout = Random(size_t(N) * OC2);
      // The CPU reference from the bf16-rounded pre-activation the GPU keeps.
      const std::vector<float> pre_gpu = DownloadBf16(d_pre);
      std::vector<float> dgelu_in(size_t(N) * OC, 0.0f), dpre_ref(size_t(N) * OC, 0.0f);
      cpu::MatmulBackward<float>(dgelu_in.data(), nullptr, nullptr, dout.data(), nullptr, w2.data(),
                                 N, OC, OC2);
      cpu::GeluBackward<float>(dpre_ref.data(), pre_gpu.data(), dgelu_in.data(), dpre_ref.size());
      auto d_w2 = UploadBf16(w2), d_dout = UploadBf16(dout);
      DeviceBuffer<Bf16> d_dpre(size_t(N) * OC), d_scratch(size_t(N) * OC);
      ASSERT_OK(MatmulDgeluBackward(*ctx_, d_dpre.get(), d_scratch.get(), d_dout->get(),
                                    d_pre.get(), d_w2->get(), N, OC, OC2));
      ExpectClose("matmul dgelu", DownloadBf16(d_dpre), dpre_ref);
    }
}

TEST_F(GpuOpsTest, LmHead) {
  for (auto [N, C, V] : {std::tuple{1, 1, 1}, std::tuple{19, 40, 67}, std::tuple{64, 128, 50257}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V));
    auto x = Random(size_t(N) * C), wte = Random(size_t(V) * C, 0.1f);
    std::vector<float> logits_ref(size_t(N) * V);
    cpu::LmHeadForward<float>(logits_ref.data(), x.data(), wte.data(), N, C, V);
    auto d_x = UploadBf16(x), d_wte = UploadBf16(wte);
    DeviceBuffer<Bf16> d_logits(size_t(N) * V);
    ASSERT_OK(LmHeadForward(*ctx_, d_logits.get(), d_x->get(), d_wte->get(), N, C, V));
    ExpectClose("lm head logits", DownloadBf16(d_logits), logits_ref);

    auto dlogits = Random(size_t(N) * V, 0.01f);
    auto dx_ref = Random(size_t(N) * C), dwte_ref = Random(size_t(V) * C);
    auto d_dx = UploadBf16(dx_ref);
    auto d_dwte = Upload(dwte_ref);
    auto d_dlogits = UploadBf16(dlogits);
    cpu::LmHeadBackward<float>(dx_ref.data(), dwte_ref.data(), dlogits.data(), x.data(), wte.data(),
                               N, C, V);
    ASSERT_OK(LmHeadBackward(*ctx_, d_dx->get(), d_dwte->get(), d_dlogits->get(), d_x->get(),
                             d_wte->get(), N, C, V));
    ExpectClose("lm head dx", DownloadBf16(*d_dx), dx_ref);
    ExpectClose("lm head dwte", Download(*d_dwte), dwte_ref, 1e-3f, 1e-3f);
  }
}

// hs = 12 (C=36, NH=3) takes the scalar paths (dot products, head copies); the others the
// 16-byte ones. Both kernels: cuBLAS + fused softmax (the default) and the naive one.
TEST_F(GpuOpsTest, Attention) {
  // variant 0: tuned, all heads in one batch; 1: tuned, one head per batch; 2: naive; 3: the
  // flash kernels, forward and backward (head sizes 64 and 128: T = 70, 257 and 128 here; the
  // others fall back to the cuBLAS path).
  for (int variant : {0, 1, 2, 3}) {
    KernelChoice k;
    k.naive_attention = variant == 2;
    k.flash_attention = variant == 3;
    if (variant == 1) k.attention_batch_bytes = 1;
    ctx_->set_kernels(k);
    const std::string tag = variant == 3   ? "attention(flash) "
                            : variant == 2 ? "attention(naive) "
                            : variant == 1 ? "attention(1 head per batch) "
                                           : "attention ";
    for (auto [B, T, C, NH] :
         {std::tuple{1, 1, 1, 1}, std::tuple{2, 17, 48, 3}, std::tuple{1, 70, 128, 2},
          std::tuple{2, 33, 96, 1}, std::tuple{1, 40, 36, 3}, std::tuple{1, 257, 256, 4},
          std::tuple{2, 128, 256, 2}}) {
      SCOPED_TRACE(tag + "B=" + std::to_string(B) + " T=" + std::to_string(T) +
                   " C=" + std::to_string(C) + " NH=" + std::to_string(NH));
      const size_t N = size_t(B) * T;
      auto qkv = Random(N * 3 * C);
      std::vector<float> out_ref(N * C), att(size_t(B) * NH * T * T);
      cpu::AttentionForward<float>(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
      auto d_qkv = UploadBf16(qkv);
      DeviceBuffer<Bf16> d_out(N * C);
      DeviceBuffer<float> d_stats(AttentionStatsSize(B, T, NH));
      ASSERT_OK(AttentionForward(*ctx_, d_out.get(), d_stats.get(), d_qkv->get(), B, T, C, NH));
      ExpectClose(tag + "out", DownloadBf16(d_out), out_ref);
      if (variant == 3) {  // deterministic: a second run gives the same bits
        DeviceBuffer<Bf16> again(N * C);
        ASSERT_OK(AttentionForward(*ctx_, again.get(), d_stats.get(), d_qkv->get(), B, T, C, NH));
        EXPECT_EQ(DownloadBf16(again), DownloadBf16(d_out));
      }

      auto dout = Random(N * C);
      auto dqkv_ref = Random(N * 3 * C);
      auto d_dqkv = UploadBf16(dqkv_ref);
      auto d_dout = UploadBf16(dout);
      cpu::AttentionBackward<float>(dqkv_ref.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                                    NH);
      ASSERT_OK(AttentionBackward(*ctx_, d_dqkv->get(), d_dout->get(), d_qkv->get(), d_stats.get(),
                                  B, T, C, NH));
      ExpectClose(tag + "dqkv", DownloadBf16(*d_dqkv), dqkv_ref);
      if (variant == 3) {  // deterministic: a second backward adds the same bits again
        auto d_again = UploadBf16(dqkv_ref);
        ASSERT_OK(AttentionForward(*ctx_, d_out.get(), d_stats.get(), d_qkv->get(), B, T, C, NH));
        ASSERT_OK(AttentionBackward(*ctx_, d_again->get(), d_dout->get(), d_qkv->get(),
                                    d_stats.get(), B, T, C, NH));
        auto d_first = UploadBf16(dqkv_ref);
        ASSERT_OK(AttentionForward(*ctx_, d_out.get(), d_stats.get(), d_qkv->get(), B, T, C, NH));
        ASSERT_OK(AttentionBackward(*ctx_, d_first->get(), d_dout->get(), d_qkv->get(),
                                    d_stats.get(), B, T, C, NH));
        EXPECT_EQ(DownloadBf16(*d_again), DownloadBf16(*d_first));
      }
    }
  }
}

TEST_F(GpuOpsTest, AttentionRejectsBadShapes) {
  DeviceBuffer<Bf16> buf(64);
  DeviceBuffer<float> stats(64);
  EXPECT_EQ(AttentionForward(*ctx_, buf.get(), stats.get(), buf.get(), 1, 2, 10, 3).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      AttentionBackward(*ctx_, buf.get(), buf.get(), buf.get(), stats.get(), 1, 2, 8, 0).code(),
      StatusCode::kInvalidArgument);
}

// The 128-bit kernels (default; the odd sizes take their scalar tails), and the one-value
// kernels (naive_elementwise).
TEST_F(GpuOpsTest, GeluAndResidual) {
  for (bool naive : {false, true})
    for (size_t n : {size_t{1}, size_t{15}, size_t{1023}, size_t{(1 << 20) + 7}}) {
      KernelChoice k;
      k.naive_elementwise = naive;
      ctx_->set_kernels(k);
      SCOPED_TRACE(std::string(naive ? "naive " : "") + "n=" + std::to_string(n));
      auto x = Random(n, 2.0f), y = Random(n), dout = Random(n);
      auto d_x = UploadBf16(x), d_y = UploadBf16(y), d_dout = UploadBf16(dout);

      std::vector<float> gelu_ref(n);
      cpu::GeluForward<float>(gelu_ref.data(), x.data(), n);
      DeviceBuffer<Bf16> d_out(n);
      ASSERT_OK(GeluForward(*ctx_, d_out.get(), d_x->get(), n));
      ExpectClose("gelu out", DownloadBf16(d_out), gelu_ref);

      auto dinp_ref = Random(n);
      auto d_dinp = UploadBf16(dinp_ref);
      cpu::GeluBackward<float>(dinp_ref.data(), x.data(), dout.data(), n);
      ASSERT_OK(GeluBackward(*ctx_, d_dinp->get(), d_x->get(), d_dout->get(), n));
      ExpectClose("gelu dinp", DownloadBf16(*d_dinp), dinp_ref);

      std::vector<float> sum_ref(n);
      cpu::ResidualForward<float>(sum_ref.data(), x.data(), y.data(), n);
      ASSERT_OK(ResidualForward(*ctx_, d_out.get(), d_x->get(), d_y->get(), n));
      ExpectClose("residual out", DownloadBf16(d_out), sum_ref);

      auto da_ref = Random(n), db_ref = Random(n);
      auto d_da = UploadBf16(da_ref), d_db = UploadBf16(db_ref);
      cpu::ResidualBackward<float>(da_ref.data(), db_ref.data(), dout.data(), n);
      ASSERT_OK(ResidualBackward(*ctx_, d_da->get(), d_db->get(), d_dout->get(), n));
      ExpectClose("residual da", DownloadBf16(*d_da), da_ref);
      ExpectClose("residual db", DownloadBf16(*d_db), db_ref);
    }
}

// The fused residual + LayerNorm against the CPU's residual then LayerNorm, and the unfused
// path (naive_elementwise) against the same.
TEST_F(GpuOpsTest, ResidualLayerNorm) {
  for (bool naive : {false, true}) {
    KernelChoice k;
    k.naive_elementwise = naive;
    ctx_->set_kernels(k);
    for (auto [N, C] : {std::pair{1, 1}, std::pair{17, 15}, std::pair{37, 768}}) {
      SCOPED_TRACE(std::string(naive ? "naive " : "") + "N=" + std::to_string(N) +
                   " C=" + std::to_string(C));
      const size_t nc = size_t(N) * C;
      auto a = Random(nc, 2.0f), b = Random(nc), w = Random(C), bias = Random(C);
      std::vector<float> res_ref(nc), out_ref(nc), mean_ref(N), rstd_ref(N);
      cpu::ResidualForward<float>(res_ref.data(), a.data(), b.data(), nc);
      for (float& r : res_ref) r = RoundBf16(r);  // the GPU keeps the residual in bf16
      cpu::LayerNormForward<float>(out_ref.data(), mean_ref.data(), rstd_ref.data(), res_ref.data(),
                                   w.data(), bias.data(), N, C);
      auto d_a = UploadBf16(a), d_b = UploadBf16(b), d_w = UploadBf16(w), d_bias = UploadBf16(bias);
      DeviceBuffer<Bf16> d_res(nc), d_out(nc);
      DeviceBuffer<float> d_mean(N), d_rstd(N);
      ASSERT_OK(ResidualLayerNormForward(*ctx_, d_res.get(), d_out.get(), d_mean.get(),
                                         d_rstd.get(), d_a->get(), d_b->get(), d_w->get(),
                                         d_bias->get(), N, C));
      const std::vector<float> res = DownloadBf16(d_res);
      EXPECT_EQ(res, res_ref);  // one rounding of an exact fp32 sum of two bf16 values
      ExpectClose("residual+layernorm out", DownloadBf16(d_out), out_ref);
      ExpectClose("residual+layernorm mean", Download(d_mean), mean_ref, 1e-4f, 1e-4f);
      ExpectClose("residual+layernorm rstd", Download(d_rstd), rstd_ref, 1e-3f, 1e-4f);
    }
  }
}

TEST_F(GpuOpsTest, SoftmaxCrossEntropy) {
  for (auto [N, V] : {std::pair{1, 1}, std::pair{23, 257}, std::pair{4, 50257}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " V=" + std::to_string(V));
    auto logits = Random(size_t(N) * V, 3.0f);
    auto targets = RandomTokens(N, V);
    std::vector<float> probs_ref(size_t(N) * V), losses_ref(N);
    const double mean_ref = cpu::SoftmaxCrossEntropyForward<float>(
        probs_ref.data(), losses_ref.data(), logits.data(), targets.data(), N, V);
    auto d_logits = UploadBf16(logits);
    auto d_targets = Upload(targets);
    DeviceBuffer<float> d_losses(N), d_mean(1);
    // In place, as the model runs it: probs overwrite the logits.
    ASSERT_OK(SoftmaxCrossEntropyForward(*ctx_, d_logits->get(), d_losses.get(), d_mean.get(),
                                         d_logits->get(), d_targets->get(), N, V));
    ExpectClose("xent probs", DownloadBf16(*d_logits), probs_ref);
    ExpectClose("xent losses", Download(d_losses), losses_ref, 1e-4f, 1e-5f);
    const float mean = Download(d_mean)[0];
    EXPECT_NEAR(mean, mean_ref, 1e-4 * std::fabs(mean_ref) + 1e-6) << "seed=" << seed_;

    const float dloss = 1.0f / N;
    std::vector<float> dlogits_ref(size_t(N) * V);
    cpu::SoftmaxCrossEntropyBackward<float>(dlogits_ref.data(), probs_ref.data(), targets.data(), N,
                                            V, dloss);
    ASSERT_OK(SoftmaxCrossEntropyBackward(*ctx_, d_logits->get(), d_logits->get(), d_targets->get(),
                                          N, V, dloss));
    ExpectClose("xent dlogits", DownloadBf16(*d_logits), dlogits_ref);
  }
}

// The fused classifier against the CPU's softmax cross-entropy forward + backward: padded rows
// (Vp = PaddedVocab(V): 16-byte path) and unpadded ones (Vp = V, V odd: one value at a time).
// The padding holds garbage that must not leak into the loss and must come back zero.
TEST_F(GpuOpsTest, FusedClassifier) {
  for (auto [N, V, padded] :
       {std::tuple{1, 1, true}, std::tuple{23, 257, true}, std::tuple{23, 257, false},
        std::tuple{4, 50257, true}, std::tuple{3, 50257, false}}) {
    const int Vp = padded ? PaddedVocab(V) : V;
    SCOPED_TRACE("N=" + std::to_string(N) + " V=" + std::to_string(V) +
                 " Vp=" + std::to_string(Vp));
    auto logits = Random(size_t(N) * V, 3.0f);
    auto targets = RandomTokens(N, V);
    std::vector<float> probs_ref(size_t(N) * V), losses_ref(N);
    const double mean_ref = cpu::SoftmaxCrossEntropyForward<float>(
        probs_ref.data(), losses_ref.data(), logits.data(), targets.data(), N, V);
    const float dloss = 1.0f / N;
    std::vector<float> dlogits_ref(size_t(N) * V);
    cpu::SoftmaxCrossEntropyBackward<float>(dlogits_ref.data(), probs_ref.data(), targets.data(), N,
                                            V, dloss);
    std::vector<float> rows = Random(size_t(N) * Vp, 50.0f);  // padding: large garbage
    for (int n = 0; n < N; ++n) {
      std::copy_n(logits.begin() + size_t(n) * V, V, rows.begin() + size_t(n) * Vp);
    }
    auto d_logits = UploadBf16(rows);
    auto d_targets = Upload(targets);
    DeviceBuffer<float> d_losses(N), d_mean(1);
    ASSERT_OK(FusedClassifier(*ctx_, d_logits->get(), d_losses.get(), d_mean.get(),
                              d_targets->get(), N, V, Vp, dloss));
    ExpectClose("classifier losses", Download(d_losses), losses_ref, 1e-4f, 1e-5f);
    const float mean = Download(d_mean)[0];
    EXPECT_NEAR(mean, mean_ref, 1e-4 * std::fabs(mean_ref) + 1e-6) << "seed=" << seed_;
    const std::vector<float> got = DownloadBf16(*d_logits);
    std::vector<float> dlogits(size_t(N) * V);
    for (int n = 0; n < N; ++n) {
      std::copy_n(got.begin() + size_t(n) * Vp, V, dlogits.begin() + size_t(n) * V);
      for (int v = V; v < Vp; ++v) ASSERT_EQ(got[size_t(n) * Vp + v], 0.0f) << n << "," << v;
    }
    ExpectClose("classifier dlogits", dlogits, dlogits_ref);
  }
  DeviceBuffer<Bf16> buf(8);
  DeviceBuffer<float> f(8);
  DeviceBuffer<int32_t> t(8);
  EXPECT_EQ(FusedClassifier(*ctx_, buf.get(), f.get(), nullptr, t.get(), 1, 9, 8, 1.0f).code(),
            StatusCode::kInvalidArgument);
}

// The same inputs twice give the same bits (no atomics, fixed reduction orders), for the
// tuned kernels and for the naive ones.
TEST_F(GpuOpsTest, BackwardIsDeterministic) {
  const int B = 4, T = 64, C = 128, NH = 4, V = 11;  // small V: many repeated tokens
  const size_t N = size_t(B) * T;
  auto qkv = UploadBf16(Random(N * 3 * C)), dout = UploadBf16(Random(N * C));
  auto tokens = Upload(RandomTokens(N, V));
  for (const char* spec : {"tuned", "naive"}) {
    SCOPED_TRACE(spec);
    auto kernels = KernelChoice::Parse(spec);
    ASSERT_TRUE(kernels.ok());
    ctx_->set_kernels(*kernels);
    DeviceBuffer<float> stats(AttentionStatsSize(B, T, NH));
    DeviceBuffer<Bf16> out(N * C);
    std::vector<float> first_out, first_dqkv, first_dwte;
    for (int run = 0; run < 2; ++run) {
      ASSERT_OK(AttentionForward(*ctx_, out.get(), stats.get(), qkv->get(), B, T, C, NH));
      DeviceBuffer<Bf16> dqkv(N * 3 * C);
      DeviceBuffer<float> dwte(size_t(V) * C), dwpe(size_t(T) * C);
      ASSERT_CUDA(cudaMemset(dqkv.get(), 0, dqkv.size() * sizeof(Bf16)));
      ASSERT_CUDA(cudaMemset(dwte.get(), 0, dwte.size() * sizeof(float)));
      ASSERT_CUDA(cudaMemset(dwpe.get(), 0, dwpe.size() * sizeof(float)));
      ASSERT_OK(
          AttentionBackward(*ctx_, dqkv.get(), dout->get(), qkv->get(), stats.get(), B, T, C, NH));
      ASSERT_OK(
          EmbeddingBackward(*ctx_, dwte.get(), dwpe.get(), dout->get(), tokens->get(), B, T, C, V));
      auto o = DownloadBf16(out);
      auto a = DownloadBf16(dqkv);
      auto b = Download(dwte);
      if (run == 0) {
        first_out = o;
        first_dqkv = a;
        first_dwte = b;
      } else {
        EXPECT_EQ(std::memcmp(o.data(), first_out.data(), o.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(a.data(), first_dqkv.data(), a.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(b.data(), first_dwte.data(), b.size() * sizeof(float)), 0);
      }
    }
  }
}

// A whole pre-LN transformer block, forward and backward, against the CPU ops composed the
// same way. Errors compound through the bf16 intermediates, hence the looser tolerance.
TEST_F(GpuOpsTest, WholeBlock) {
  BlockShape s;
  s.B = 2, s.T = 33, s.C = 64, s.NH = 4;
  const int N = static_cast<int>(s.N()), C = s.C, B = s.B, T = s.T, NH = s.NH;
  const size_t nc = size_t(N) * C;
  const size_t P = BlockParams::Count(C);

  // Parameters: GPT-2-like scales (LayerNorm weights near 1).
  std::vector<float> params = Random(P, 0.05f);
  {
    auto t = BlockTensors<float>::Carve(params.data(), C);
    for (int c = 0; c < C; ++c) {
      t.ln1_w[c] = RoundBf16(1.0f + t.ln1_w[c]);
      t.ln2_w[c] = RoundBf16(1.0f + t.ln2_w[c]);
    }
  }
  const auto x = Random(nc), dy = Random(nc);
  const auto cp = BlockTensors<float>::Carve(params.data(), C);

  // CPU reference forward.
  std::vector<float> ln1(nc), m1(N), r1(N), qkv(3 * nc), att(size_t(B) * NH * T * T), atty(nc),
      tmp(nc), res2(nc), ln2(nc), m2(N), r2(N), fch(4 * nc), fcg(4 * nc), y(nc);
  cpu::LayerNormForward<float>(ln1.data(), m1.data(), r1.data(), x.data(), cp.ln1_w, cp.ln1_b, N,
                               C);
  cpu::MatmulForward<float>(qkv.data(), ln1.data(), cp.qkv_w, cp.qkv_b, N, C, 3 * C);
  cpu::AttentionForward<float>(atty.data(), att.data(), qkv.data(), B, T, C, NH);
  cpu::MatmulForward<float>(tmp.data(), atty.data(), cp.attn_proj_w, cp.attn_proj_b, N, C, C);
  cpu::ResidualForward<float>(res2.data(), x.data(), tmp.data(), nc);
  cpu::LayerNormForward<float>(ln2.data(), m2.data(), r2.data(), res2.data(), cp.ln2_w, cp.ln2_b, N,
                               C);
  cpu::MatmulForward<float>(fch.data(), ln2.data(), cp.fc_w, cp.fc_b, N, C, 4 * C);
  cpu::GeluForward<float>(fcg.data(), fch.data(), 4 * nc);
  cpu::MatmulForward<float>(tmp.data(), fcg.data(), cp.fc_proj_w, cp.fc_proj_b, N, 4 * C, C);
  cpu::ResidualForward<float>(y.data(), res2.data(), tmp.data(), nc);

  // CPU reference backward.
  std::vector<float> grads(P, 0.0f), dx(nc, 0.0f), dres2(nc, 0.0f), dmlp(nc, 0.0f),
      dfcg(4 * nc, 0.0f), dfch(4 * nc, 0.0f), dln2(nc, 0.0f), dattp(nc, 0.0f), datty(nc, 0.0f),
      dqkv(3 * nc, 0.0f), dln1(nc, 0.0f);
  auto cg = BlockTensors<float>::Carve(grads.data(), C);
  cpu::ResidualBackward<float>(dres2.data(), dmlp.data(), dy.data(), nc);
  cpu::MatmulBackward<float>(dfcg.data(), cg.fc_proj_w, cg.fc_proj_b, dmlp.data(), fcg.data(),
                             cp.fc_proj_w, N, 4 * C, C);
  cpu::GeluBackward<float>(dfch.data(), fch.data(), dfcg.data(), 4 * nc);
  cpu::MatmulBackward<float>(dln2.data(), cg.fc_w, cg.fc_b, dfch.data(), ln2.data(), cp.fc_w, N, C,
                             4 * C);
  cpu::LayerNormBackward<float>(dres2.data(), cg.ln2_w, cg.ln2_b, dln2.data(), res2.data(),
                                cp.ln2_w, m2.data(), r2.data(), N, C);
  cpu::ResidualBackward<float>(dx.data(), dattp.data(), dres2.data(), nc);
  cpu::MatmulBackward<float>(datty.data(), cg.attn_proj_w, cg.attn_proj_b, dattp.data(),
                             atty.data(), cp.attn_proj_w, N, C, C);
  cpu::AttentionBackward<float>(dqkv.data(), datty.data(), qkv.data(), att.data(), B, T, C, NH);
  cpu::MatmulBackward<float>(dln1.data(), cg.qkv_w, cg.qkv_b, dqkv.data(), ln1.data(), cp.qkv_w, N,
                             C, 3 * C);
  cpu::LayerNormBackward<float>(dx.data(), cg.ln1_w, cg.ln1_b, dln1.data(), x.data(), cp.ln1_w,
                                m1.data(), r1.data(), N, C);

  // GPU: the tuned kernels (default) and the previous ones; the same tolerances for both.
  for (const char* spec : {"tuned", "naive"}) {
    SCOPED_TRACE(spec);
    ctx_->set_kernels(*KernelChoice::Parse(spec));
    const std::string tag = std::string(spec) == "naive" ? "(naive) " : "";
    // What the model reserves at start-up covers every op of the block (no growth below).
    const size_t reserved = ModelWorkspaceBytes(*ctx_, B, T, C, NH);
    if (tag.empty()) {
      ASSERT_TRUE(ctx_->Workspace(reserved).ok());
    }
    auto d_params = UploadBf16(params);
    auto d_x = UploadBf16(x), d_dy = UploadBf16(dy);
    DeviceBuffer<float> d_grads(P);
    DeviceBuffer<Bf16> d_y(nc), d_tmp(nc), d_dx(nc);
    DeviceBuffer<char> d_act(BlockActivations::Bytes(s)), d_scratch(BlockScratch::Bytes(s));
    ASSERT_CUDA(cudaMemset(d_grads.get(), 0, P * sizeof(float)));
    ASSERT_CUDA(cudaMemset(d_dx.get(), 0, nc * sizeof(Bf16)));
    const BlockParams gp = BlockParams::Carve(d_params->get(), C);
    const BlockGrads gg = BlockGrads::Carve(d_grads.get(), C);
    const BlockActivations act = BlockActivations::Carve(d_act.get(), s);
    const BlockScratch scratch = BlockScratch::Carve(d_scratch.get(), s);
    ASSERT_OK(BlockForward(*ctx_, s, gp, d_x->get(), d_y.get(), d_tmp.get(), act));
    ASSERT_OK(BlockBackward(*ctx_, s, gp, gg, d_x->get(), act, d_dy->get(), d_dx.get(), scratch));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    if (tag.empty()) {
      EXPECT_EQ(ctx_->workspace_bytes(), reserved);
    }

    ExpectClose(tag + "block y", DownloadBf16(d_y), y, 1e-2f, 3e-2f);
    ExpectClose(tag + "block dx", DownloadBf16(d_dx), dx, 1e-2f, 3e-2f);
    // Each parameter tensor separately, so that a failure names it.
    const std::vector<float> got = Download(d_grads);
    const auto gt = BlockTensors<const float>::Carve(got.data(), C);
    const auto rt = BlockTensors<const float>::Carve(grads.data(), C);
    const struct {
      const char* name;
      const float *g, *r;
      size_t n;
    } pieces[] = {
        {"ln_1.weight", gt.ln1_w, rt.ln1_w, size_t(C)},
        {"ln_1.bias", gt.ln1_b, rt.ln1_b, size_t(C)},
        {"attn.c_attn.weight", gt.qkv_w, rt.qkv_w, 3 * size_t(C) * C},
        {"attn.c_attn.bias", gt.qkv_b, rt.qkv_b, 3 * size_t(C)},
        {"attn.c_proj.weight", gt.attn_proj_w, rt.attn_proj_w, size_t(C) * C},
        {"attn.c_proj.bias", gt.attn_proj_b, rt.attn_proj_b, size_t(C)},
        {"ln_2.weight", gt.ln2_w, rt.ln2_w, size_t(C)},
        {"ln_2.bias", gt.ln2_b, rt.ln2_b, size_t(C)},
        {"mlp.c_fc.weight", gt.fc_w, rt.fc_w, 4 * size_t(C) * C},
        {"mlp.c_fc.bias", gt.fc_b, rt.fc_b, 4 * size_t(C)},
        {"mlp.c_proj.weight", gt.fc_proj_w, rt.fc_proj_w, 4 * size_t(C) * C},
        {"mlp.c_proj.bias", gt.fc_proj_b, rt.fc_proj_b, size_t(C)},
    };
    for (const auto& p : pieces) {
      ExpectClose(tag + "block grad " + p.name, std::vector<float>(p.g, p.g + p.n),
                  std::vector<float>(p.r, p.r + p.n), 1e-2f, 3e-2f);
    }
  }
}

}  // namespace
}  // namespace strata::model::cuda_ops
