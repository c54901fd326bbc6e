// gpu_model_bench: GPT-2 forward+backward throughput on one GPU with the model held in GPU
// memory (model/cuda/), and host<->device copy bandwidth against the cudaMemcpy peak measured
// in the same run.
//
// Cases:
//   model fwd+bwd   embeddings, L blocks, final LayerNorm, tied LM head, cross-entropy, and the
//                   whole backward pass (gradients zeroed each step). tokens/s = B·T / median
//                   step time; TFLOP/s from 6·params + 12·L·T·C FLOPs per token. The bound it is
//                   compared with: the same run's cuBLAS GEMMs of the model's shapes alone
//                   (gemm_ratio = gemm_only_ms / step_ms; 1.0 = the non-GEMM kernels cost
//                   nothing). Then (unless --no-naive) the same step with the previous
//                   kernels (STRATA_CUDA_KERNELS=naive) and the speedup.
//   kernels         each op that has a tuned and a previous kernel, on the model's shapes
//                   (attention fwd/bwd, LM head + classifier, embedding bwd, fc + GELU,
//                   fc_proj bwd + GELU bwd, residual + LayerNorm, GELU bwd):
//                   tuned_ms, naive_ms, speedup, and the largest difference of their outputs
//                   relative to the output's largest value (#wrong above 2e-2; embedding
//                   backward must match bit for bit).
//   copies          one large cudaMemcpyAsync from/to pinned memory (the peak), then the
//                   model's transfer pattern (one copy per block: bf16 parameters H2D, fp32
//                   gradients D2H), pageable memory, both directions at once, and
//                   strata::Device::CopyToDevice/CopyToHost (what the engine uses);
//                   ratio = GB/s / the peak of that direction.
// #wrong: model: 1 when the initial loss is not finite or far from the expected
//         ln V + 0.0002·C (near-uniform predictions at GPT-2's initialisation), or the naive
//         kernels' first loss is more than 1 % from the tuned ones'; copies: the
//         number of bytes that differ after a round trip.
//
// Run (needs a GPU; prints a message and exits 0 without one):
//   cmake --build build/cuda --target gpu_model_bench && build/cuda/bench/gpu_model_bench
//   build/cuda/bench/gpu_model_bench --layers 12 --d-model 768 --heads 12 --seq-len 1024
//       --batch 8 --vocab 50257 --iters 10 --json /tmp/gpu_model_bench.json   (one line)
//   --model-only skips the copy cases; --no-naive skips the previous kernels.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "model/bench_stats.h"
#include "model/cuda/gpt2_cuda_block.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "strata/device.h"

namespace strata::model::cuda_ops {
namespace {

struct Config {
  int layers = 12, d_model = 768, heads = 12, seq_len = 1024, batch = 8, vocab = 50257;
  int iters = 10, warmup = 3;
  int copy_mib = 256;
  bool naive = true;  // also time the previous kernels (whole step and per kernel)
  bool model_only = false;
  std::string json;
};

std::vector<Bf16> RandomBf16(size_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<Bf16> v(n);
  for (Bf16& x : v) x = __float2bfloat16(dist(rng));
  return v;
}

// The whole GPT-2 held in GPU memory.
class GpuModel {
 public:
  GpuModel(const Config& cfg, CudaOpContext& ctx) : cfg_(cfg), ctx_(ctx) {
    s_.B = cfg.batch, s_.T = cfg.seq_len, s_.C = cfg.d_model, s_.NH = cfg.heads;
    // wte, its gradient and the logits are held at the padded vocabulary (zero rows beyond V),
    // as in the CUDA model; the naive classifier uses the first V rows / columns.
    Vp_ = PaddedVocab(cfg.vocab);
    const size_t N = size_t(s_.N()), C = size_t(s_.C), V = size_t(Vp_), T = size_t(s_.T);
    const int L = cfg.layers;
    block_params_ = BlockParams::Count(s_.C);
    std::mt19937 rng(1234);

    {
      std::vector<Bf16> wte = RandomBf16(V * C, 0.02f, rng);
      std::fill(wte.begin() + size_t(cfg.vocab) * C, wte.end(), __float2bfloat16(0.0f));
      wte_ = Upload(wte);
    }
    wpe_ = Upload(RandomBf16(T * C, 0.01f, rng));
    std::vector<Bf16> ones(C, __float2bfloat16(1.0f)), zeros(C, __float2bfloat16(0.0f));
    lnf_w_ = Upload(ones);
    lnf_b_ = Upload(zeros);
    // Every block starts from the same values (generating 12C² values per block on the host
    // would dominate start-up); LayerNorm weights 1, biases 0, matrices N(0, 0.02²).
    std::vector<Bf16> block = RandomBf16(block_params_, 0.02f, rng);
    {
      auto t = BlockTensors<Bf16>::Carve(block.data(), s_.C);
      for (size_t c = 0; c < C; ++c) {
        t.ln1_w[c] = t.ln2_w[c] = __float2bfloat16(1.0f);
        t.ln1_b[c] = t.ln2_b[c] = __float2bfloat16(0.0f);
      }
    }
    params_ = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * block_params_ * L));
    for (int l = 0; l < L; ++l) {
      BENCH_CHECK_CUDA(cudaMemcpy(params_ + l * block_params_, block.data(),
                                  sizeof(Bf16) * block_params_, cudaMemcpyHostToDevice));
    }
    grads_bytes_ = sizeof(float) * (block_params_ * L + V * C + T * C + 2 * C);
    grads_ = static_cast<float*>(DeviceAlloc(grads_bytes_));
    dwte_ = grads_ + block_params_ * L;
    dwpe_ = dwte_ + V * C;
    dlnf_w_ = dwpe_ + T * C;
    dlnf_b_ = dlnf_w_ + C;

    act_bytes_ = BlockActivations::Bytes(s_);
    acts_ = static_cast<char*>(DeviceAlloc(act_bytes_ * L));
    scratch_ = BlockScratch::Carve(DeviceAlloc(BlockScratch::Bytes(s_)), s_);
    xs_ = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * C * (L + 1)));
    tmp_ = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * C));
    lnf_ = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * C));
    d_lnf_ = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * C));
    dres_[0] = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * C));
    dres_[1] = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * C));
    lnf_mean_ = static_cast<float*>(DeviceAlloc(sizeof(float) * N));
    lnf_rstd_ = static_cast<float*>(DeviceAlloc(sizeof(float) * N));
    logits_ = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * N * V));
    losses_ = static_cast<float*>(DeviceAlloc(sizeof(float) * N));
    mean_loss_ = static_cast<float*>(DeviceAlloc(sizeof(float)));

    std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
    std::vector<int32_t> tokens(N + 1);
    for (int32_t& t : tokens) t = tok(rng);
    tokens_ = static_cast<int32_t*>(DeviceAlloc(sizeof(int32_t) * (N + 1)));
    BENCH_CHECK_CUDA(
        cudaMemcpy(tokens_, tokens.data(), sizeof(int32_t) * (N + 1), cudaMemcpyHostToDevice));
    targets_ = tokens_ + 1;  // next-token targets
  }

  size_t Params() const {
    return block_params_ * cfg_.layers + size_t(cfg_.vocab) * s_.C + size_t(s_.T) * s_.C +
           2 * size_t(s_.C);
  }
  size_t BlockParamBytes() const { return sizeof(Bf16) * block_params_; }
  size_t BlockGradBytes() const { return sizeof(float) * block_params_; }

  void Step() {
    const int N = static_cast<int>(s_.N()), C = s_.C, L = cfg_.layers;
    const size_t nc = size_t(N) * C;
    BENCH_CHECK_CUDA(cudaMemsetAsync(grads_, 0, grads_bytes_, ctx_.stream()));
    BENCH_CHECK(EmbeddingForward(ctx_, X(0), tokens_, wte_, wpe_, s_.B, s_.T, C));
    for (int l = 0; l < L; ++l) {
      BENCH_CHECK(BlockForward(ctx_, s_, P(l), X(l), X(l + 1), tmp_, A(l)));
    }
    BENCH_CHECK(LayerNormForward(ctx_, lnf_, lnf_mean_, lnf_rstd_, X(L), lnf_w_, lnf_b_, N, C));
    const int VL = Vlogits();
    BENCH_CHECK(LmHeadForward(ctx_, logits_, lnf_, wte_, N, C, VL));
    BENCH_CHECK(Classifier());
    BENCH_CHECK_CUDA(cudaMemsetAsync(d_lnf_, 0, sizeof(Bf16) * nc, ctx_.stream()));
    BENCH_CHECK(LmHeadBackward(ctx_, d_lnf_, dwte_, logits_, lnf_, wte_, N, C, VL));
    BENCH_CHECK_CUDA(cudaMemsetAsync(dres_[0], 0, sizeof(Bf16) * nc, ctx_.stream()));
    BENCH_CHECK(LayerNormBackward(ctx_, dres_[0], dlnf_w_, dlnf_b_, d_lnf_, X(L), lnf_w_, lnf_mean_,
                                  lnf_rstd_, N, C));
    int cur = 0;
    for (int l = L - 1; l >= 0; --l) {
      BENCH_CHECK_CUDA(cudaMemsetAsync(dres_[1 - cur], 0, sizeof(Bf16) * nc, ctx_.stream()));
      BENCH_CHECK(
          BlockBackward(ctx_, s_, P(l), G(l), X(l), A(l), dres_[cur], dres_[1 - cur], scratch_));
      cur = 1 - cur;
    }
    BENCH_CHECK(
        EmbeddingBackward(ctx_, dwte_, dwpe_, dres_[cur], tokens_, s_.B, s_.T, C, cfg_.vocab));
  }

  // The logits' row length: the padded vocabulary for the fused classifier, else V.
  int Vlogits() const { return ctx_.kernels().naive_classifier ? cfg_.vocab : Vp_; }
  // Loss and dlogits over logits_ (as LmHeadForward left them at Vlogits()), in place.
  Status Classifier() {
    const int N = static_cast<int>(s_.N()), V = cfg_.vocab;
    if (!ctx_.kernels().naive_classifier) {
      return FusedClassifier(ctx_, logits_, losses_, mean_loss_, targets_, N, V, Vp_, 1.0f / N);
    }
    STRATA_RETURN_IF_ERROR(
        SoftmaxCrossEntropyForward(ctx_, logits_, losses_, mean_loss_, logits_, targets_, N, V));
    return SoftmaxCrossEntropyBackward(ctx_, logits_, logits_, targets_, N, V, 1.0f / N);
  }

  // The GEMMs of Step() alone (same shapes, same buffers, no bias or other kernels).
  void GemmsOnly() {
    const int N = static_cast<int>(s_.N()), C = s_.C, V = Vlogits(), L = cfg_.layers;
    for (int l = 0; l < L; ++l) {
      const BlockParams p = P(l);
      const BlockActivations a = A(l);
      BENCH_CHECK(MatmulForward(ctx_, a.qkv, a.ln1, p.qkv_w, nullptr, N, C, 3 * C));
      BENCH_CHECK(MatmulForward(ctx_, tmp_, a.atty, p.attn_proj_w, nullptr, N, C, C));
      BENCH_CHECK(MatmulForward(ctx_, a.fch, a.ln2, p.fc_w, nullptr, N, C, 4 * C));
      BENCH_CHECK(MatmulForward(ctx_, tmp_, a.fcg, p.fc_proj_w, nullptr, N, 4 * C, C));
    }
    BENCH_CHECK(LmHeadForward(ctx_, logits_, lnf_, wte_, N, C, V));
    BENCH_CHECK(LmHeadBackward(ctx_, d_lnf_, dwte_, logits_, lnf_, wte_, N, C, V));
    for (int l = L - 1; l >= 0; --l) {
      const BlockParams p = P(l);
      const BlockGrads g = G(l);
      const BlockActivations a = A(l);
      BENCH_CHECK(MatmulBackward(ctx_, scratch_.d_fcg, g.fc_proj_w, nullptr, tmp_, a.fcg,
                                 p.fc_proj_w, N, 4 * C, C));
      BENCH_CHECK(MatmulBackward(ctx_, scratch_.d_ln, g.fc_w, nullptr, scratch_.d_fch, a.ln2,
                                 p.fc_w, N, C, 4 * C));
      BENCH_CHECK(MatmulBackward(ctx_, scratch_.d_tmp, g.attn_proj_w, nullptr, tmp_, a.atty,
                                 p.attn_proj_w, N, C, C));
      BENCH_CHECK(MatmulBackward(ctx_, scratch_.d_ln, g.qkv_w, nullptr, scratch_.d_qkv, a.ln1,
                                 p.qkv_w, N, C, 3 * C));
    }
  }

  float Loss() {
    float loss = 0;
    BENCH_CHECK_CUDA(cudaStreamSynchronize(ctx_.stream()));
    BENCH_CHECK_CUDA(cudaMemcpy(&loss, mean_loss_, sizeof(float), cudaMemcpyDeviceToHost));
    return loss;
  }

 private:
  Bf16* Upload(const std::vector<Bf16>& host) {
    auto* p = static_cast<Bf16*>(DeviceAlloc(sizeof(Bf16) * host.size()));
    BENCH_CHECK_CUDA(
        cudaMemcpy(p, host.data(), sizeof(Bf16) * host.size(), cudaMemcpyHostToDevice));
    return p;
  }
  Bf16* X(int l) { return xs_ + size_t(l) * s_.N() * s_.C; }
  BlockParams P(int l) const { return BlockParams::Carve(params_ + l * block_params_, s_.C); }
  BlockGrads G(int l) const { return BlockGrads::Carve(grads_ + l * block_params_, s_.C); }
  BlockActivations A(int l) const {
    return BlockActivations::Carve(acts_ + size_t(l) * act_bytes_, s_);
  }

  friend class KernelBench;
  const Config& cfg_;
  CudaOpContext& ctx_;
  int Vp_ = 0;
  BlockShape s_;
  size_t block_params_ = 0, grads_bytes_ = 0, act_bytes_ = 0;
  // Device memory is released at process exit (a benchmark process holds one model).
  Bf16 *wte_, *wpe_, *lnf_w_, *lnf_b_, *params_;
  float *grads_, *dwte_, *dwpe_, *dlnf_w_, *dlnf_b_;
  char* acts_;
  BlockScratch scratch_;
  Bf16 *xs_, *tmp_, *lnf_, *d_lnf_, *dres_[2], *logits_;
  float *lnf_mean_, *lnf_rstd_, *losses_, *mean_loss_;
  int32_t *tokens_, *targets_;
};

// Per-kernel milliseconds of the tuned kernels against the previous (naive) ones on the
// model's shapes (layer 0's activations after a step), and how far their outputs are apart:
// max |tuned - naive| / max |naive| over the op's output (#wrong when above 2e-2, the ops
// test's tolerance scale; embedding: any difference, the two must give the same bits).
struct KernelRow {
  std::string name;
  double tuned_ms, naive_ms, diff;
  int wrong;
};

class KernelBench {
 public:
  KernelBench(GpuModel& m, cudaStream_t stream, int warmup, int iters)
      : m_(m), stream_(stream), warmup_(warmup), iters_(iters) {}

  std::vector<KernelRow> Run() {
    GpuModel& m = m_;
    const BlockShape& s = m.s_;
    const int N = static_cast<int>(s.N()), C = s.C, V = m.cfg_.vocab;
    const BlockActivations a = m.A(0);
    const size_t nc = size_t(N) * C;
    std::vector<KernelRow> rows;
    // Attention with the tuned kernels, and with the flash kernels (KernelChoice::
    // flash_attention, opt-in), each against the naive ones.
    KernelChoice flash;
    flash.flash_attention = true;
    for (const auto& [suffix, tuned] :
         {std::pair<std::string, KernelChoice>{"", KernelChoice{}}, {"_flash", flash}}) {
      rows.push_back(Compare(
          ("attention_fwd" + suffix).c_str(),
          [&] { return AttentionForward(m.ctx_, a.atty, a.att_stats, a.qkv, s.B, s.T, C, s.NH); },
          [&] { return Bf16Out(a.atty, nc); }, nullptr, 2e-2, tuned));
      rows.push_back(Compare(
          ("attention_bwd" + suffix).c_str(),
          [&] {
            return AttentionBackward(m.ctx_, m.scratch_.d_qkv, m.X(1), a.qkv, a.att_stats, s.B, s.T,
                                     C, s.NH);
          },
          [&] { return Bf16Out(m.scratch_.d_qkv, 3 * nc); },
          [&] {
            BENCH_CHECK(AttentionForward(m.ctx_, a.atty, a.att_stats, a.qkv, s.B, s.T, C, s.NH));
            BENCH_CHECK_CUDA(cudaMemsetAsync(m.scratch_.d_qkv, 0, 3 * nc * sizeof(Bf16), stream_));
          },
          2e-2, tuned));
    }
    // The classifier includes the LM-head forward that makes its input (it works in place).
    rows.push_back(Compare(
        "lmhead+classifier",
        [&] {
          STRATA_RETURN_IF_ERROR(
              LmHeadForward(m.ctx_, m.logits_, m.lnf_, m.wte_, N, C, m.Vlogits()));
          return m.Classifier();
        },
        [&] {
          // The real V columns of each row, whatever the row length.
          std::vector<float> all = Bf16Out(m.logits_, size_t(N) * m.Vlogits());
          std::vector<float> out;
          for (int n = 0; n < N; ++n) {
            const float* row = all.data() + size_t(n) * m.Vlogits();
            out.insert(out.end(), row, row + V);
          }
          return out;
        },
        nullptr, 2e-2));
    rows.push_back(Compare(
        "embedding_bwd",
        [&] {
          return EmbeddingBackward(m.ctx_, m.dwte_, nullptr, m.X(1), m.tokens_, s.B, s.T, C, V);
        },
        [&] { return F32Out(m.dwte_, size_t(V) * C); },
        [&] {
          BENCH_CHECK_CUDA(cudaMemsetAsync(m.dwte_, 0, sizeof(float) * size_t(V) * C, stream_));
        },
        0.0));
    const BlockParams p = m.P(0);
    const BlockGrads g = m.G(0);
    rows.push_back(Compare(
        "mlp_fwd(fc+gelu)",
        [&] { return MatmulGeluForward(m.ctx_, a.fcg, a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C); },
        [&] { return Bf16Out(a.fcg, 4 * nc); }, nullptr, 2e-2));
    rows.push_back(Compare(
        "mlp_bwd(proj+dgelu)",
        [&] {
          STRATA_RETURN_IF_ERROR(MatmulBackward(m.ctx_, nullptr, g.fc_proj_w, g.fc_proj_b, m.X(1),
                                                a.fcg, p.fc_proj_w, N, 4 * C, C));
          return MatmulDgeluBackward(m.ctx_, m.scratch_.d_fch, m.scratch_.d_fcg, m.X(1), a.fch,
                                     p.fc_proj_w, N, 4 * C, C);
        },
        [&] { return Bf16Out(m.scratch_.d_fch, 4 * nc); }, nullptr, 2e-2));
    rows.push_back(Compare(
        "residual+layernorm",
        [&] {
          return ResidualLayerNormForward(m.ctx_, a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, m.X(0),
                                          m.tmp_, p.ln2_w, p.ln2_b, N, C);
        },
        [&] { return Bf16Out(a.ln2, nc); }, nullptr, 2e-2));
    rows.push_back(Compare(
        "gelu_bwd",
        [&] { return GeluBackward(m.ctx_, m.scratch_.d_fch, a.fch, m.scratch_.d_fcg, 4 * nc); },
        [&] { return Bf16Out(m.scratch_.d_fch, 4 * nc); },
        [&] {
          BENCH_CHECK_CUDA(cudaMemsetAsync(m.scratch_.d_fch, 0, 4 * nc * sizeof(Bf16), stream_));
        },
        2e-2));
    m.ctx_.set_kernels(KernelChoice{});
    return rows;
  }

 private:
  // Times `op` with the tuned kernels (`tuned`) and with the naive ones; `prepare` (may be
  // null) runs before the single run whose output `read` fetches for the comparison.
  KernelRow Compare(const char* name, const std::function<Status()>& op,
                    const std::function<std::vector<float>()>& read,
                    const std::function<void()>& prepare, double tolerance,
                    const KernelChoice& tuned = KernelChoice{}) {
    KernelRow row{name, 0, 0, 0, 0};
    std::vector<float> outs[2];
    for (int variant = 0; variant < 2; ++variant) {
      KernelChoice k = tuned;
      if (variant == 1) k = *KernelChoice::Parse("naive");
      m_.ctx_.set_kernels(k);
      if (prepare) prepare();
      BENCH_CHECK(op());
      outs[variant] = read();
      const double ms = TimeMs(stream_, warmup_, iters_, [&] { BENCH_CHECK(op()); });
      (variant == 0 ? row.tuned_ms : row.naive_ms) = ms;
    }
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < outs[1].size(); ++i) {
      max_ref = std::max(max_ref, double(std::fabs(outs[1][i])));
      const double e = std::fabs(double(outs[0][i]) - outs[1][i]);
      max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
    }
    row.diff = max_ref > 0 ? max_err / max_ref : max_err;
    row.wrong = (outs[0].size() != outs[1].size() || !(row.diff <= tolerance)) ? 1 : 0;
    return row;
  }
  std::vector<float> Bf16Out(const Bf16* p, size_t n) {
    BENCH_CHECK_CUDA(cudaStreamSynchronize(stream_));
    std::vector<Bf16> h(n);
    BENCH_CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(Bf16), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
    return out;
  }
  std::vector<float> F32Out(const float* p, size_t n) {
    BENCH_CHECK_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> out(n);
    BENCH_CHECK_CUDA(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }

  GpuModel& m_;
  cudaStream_t stream_;
  int warmup_, iters_;
};

struct CopyRow {
  std::string name;
  double mib, gbps, peak, ratio;
  uint64_t wrong;
};

// Writes `doc` to `path` ("" = nowhere); false (and a message) when it cannot.
bool WriteJson(const std::string& path, const nlohmann::json& doc) {
  if (path.empty()) return true;
  std::ofstream out(path);
  out << doc.dump(2) << "\n";
  if (!out) std::fprintf(stderr, "error: cannot write --json file %s\n", path.c_str());
  return static_cast<bool>(out);
}

// Per kernel, on the model's shapes: the tuned kernels against the previous ones. Returns
// 1 when a kernel's result differs beyond its tolerance, else 0.
int MeasureKernels(const Config& cfg, GpuModel& model, cudaStream_t stream, nlohmann::json* doc) {
  int wrong = 0;
  KernelBench kernels(model, stream, cfg.warmup, cfg.iters);
  const std::vector<KernelRow> krows = kernels.Run();
  std::printf("%-18s %10s %10s %8s %12s %7s\n", "#kernel", "tuned_ms", "naive_ms", "speedup",
              "max_rel_diff", "#wrong");
  nlohmann::json kj = nlohmann::json::array();
  for (const KernelRow& r : krows) {
    std::printf("%-18s %10.3f %10.3f %8.2f %12.3g %7d\n", r.name.c_str(), r.tuned_ms, r.naive_ms,
                r.naive_ms / r.tuned_ms, r.diff, r.wrong);
    kj.push_back({{"kernel", r.name},
                  {"tuned_ms", r.tuned_ms},
                  {"naive_ms", r.naive_ms},
                  {"speedup", r.naive_ms / r.tuned_ms},
                  {"max_rel_diff", r.diff},
                  {"wrong", r.wrong}});
    if (r.wrong) wrong = 1;
  }
  (*doc)["kernels"] = kj;
  return wrong;
}

struct ModelOutcome {
  int wrong_model = 0;    // the first loss is off (either kernel set), or the two disagree
  int wrong_kernels = 0;  // a kernel differs beyond its tolerance (with --naive)
};

// The model's rows: the whole step with the tuned kernels (and with --naive the previous ones,
// then per kernel), and its GEMMs alone; prints the header lines and the rows, fills doc["model"].
ModelOutcome MeasureModel(const Config& cfg, const cudaDeviceProp& prop, int runtime,
                          CudaOpContext& ctx, GpuModel& model, cudaStream_t stream,
                          nlohmann::json* doc) {
  int wrong_kernels = 0;
  const double tokens = double(cfg.batch) * cfg.seq_len;
  std::printf("# gpu_model_bench on %s (%d SMs, %.1f GiB), CUDA runtime %d\n", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, runtime);
  std::printf(
      "# model: layers=%d d_model=%d heads=%d seq_len=%d batch=%d vocab=%d params=%.1fM"
      " (bf16 weights/activations, fp32 grads), held in GPU memory\n",
      cfg.layers, cfg.d_model, cfg.heads, cfg.seq_len, cfg.batch, cfg.vocab, model.Params() / 1e6);
  std::printf("# timing: median of %d steps after %d warm-up steps (CUDA events)\n", cfg.iters,
              cfg.warmup);
  // The tuned kernels (whatever STRATA_CUDA_KERNELS says), then the previous ones.
  ctx.set_kernels(KernelChoice{});
  model.Step();
  const float loss0 = model.Loss();
  const double step_ms = TimeMs(stream, cfg.warmup, cfg.iters, [&] { model.Step(); });
  double naive_step_ms = 0;
  float naive_loss0 = 0;
  if (cfg.naive) {
    ctx.set_kernels(*KernelChoice::Parse("naive"));
    model.Step();
    naive_loss0 = model.Loss();
    naive_step_ms = TimeMs(stream, cfg.warmup, cfg.iters, [&] { model.Step(); });
    ctx.set_kernels(KernelChoice{});
  }
  const double gemm_ms = TimeMs(stream, cfg.warmup, cfg.iters, [&] { model.GemmsOnly(); });
  const double flops_per_token =
      6.0 * model.Params() + 12.0 * cfg.layers * double(cfg.seq_len) * cfg.d_model;
  const double tok_s = tokens / (step_ms / 1e3);
  const double tflops = flops_per_token * tok_s / 1e12;
  // At initialisation the final LayerNorm output has unit variance per row and wte is
  // N(0, 0.02²), so the logits are ~N(0, σ²) with σ² = 0.0004·C and the expected loss is about
  // ln V + σ²/2.
  const double sigma2 = 0.0004 * cfg.d_model;
  const double expected_loss0 = std::log(double(cfg.vocab)) + 0.5 * sigma2;
  const auto loss_wrong = [&](float loss) {
    return !std::isfinite(loss) || std::fabs(loss - expected_loss0) > 0.25 + 0.25 * sigma2;
  };
  // Both kernel sets see the same first batch: their losses agree to bf16 rounding.
  const int wrong_model =
      (loss_wrong(loss0) ||
       (cfg.naive && (loss_wrong(naive_loss0) || std::fabs(naive_loss0 - loss0) > 0.01 * loss0)))
          ? 1
          : 0;
  std::printf("%-16s %10s %12s %9s %13s %11s %9s %7s\n", "#case", "step_ms", "tokens/s", "TFLOP/s",
              "gemm_only_ms", "gemm_ratio", "loss0", "#wrong");
  std::printf("%-16s %10.3f %12.0f %9.2f %13.3f %11.3f %9.4f %7d\n", "fwd+bwd", step_ms, tok_s,
              tflops, gemm_ms, gemm_ms / step_ms, loss0, wrong_model);
  (*doc)["model"] = {
      {"step_ms", step_ms},      {"tokens_per_s", tok_s},           {"tflops", tflops},
      {"gemm_only_ms", gemm_ms}, {"gemm_ratio", gemm_ms / step_ms}, {"loss0", loss0},
      {"wrong", wrong_model}};
  if (cfg.naive) {
    std::printf("%-16s %10.3f %12.0f %9.2f %13s %11s %9.4f %7s\n", "fwd+bwd(naive)", naive_step_ms,
                tokens / (naive_step_ms / 1e3),
                flops_per_token * tokens / (naive_step_ms / 1e3) / 1e12, "", "", naive_loss0, "");
    std::printf("# speedup of the tuned kernels over the previous ones, whole step: %.2fx\n",
                naive_step_ms / step_ms);
    (*doc)["model"]["naive_step_ms"] = naive_step_ms;
    (*doc)["model"]["naive_loss0"] = naive_loss0;
    (*doc)["model"]["speedup"] = naive_step_ms / step_ms;

    wrong_kernels = MeasureKernels(cfg, model, stream, doc);
  }
  return {wrong_model, wrong_kernels};
}

// strata::Device, as the engine uses it: registered host memory, the H2D / D2H lanes. Appends
// the device_api_h2d and device_api_d2h rows (or says why they are skipped).
void MeasureDeviceApiCopies(size_t bytes, const unsigned char* src, double h2d_peak,
                            double d2h_peak, int reps,
                            const std::function<uint64_t(const void*)>& verify,
                            std::vector<CopyRow>* rows) {
  const double mib = double(bytes) / (1 << 20);
  auto gbps = [&](double ms, size_t moved) { return moved / (ms / 1e3) / 1e9; };
  DeviceOptions opts;
  auto device_or = CreateCudaDevice(opts);
  if (device_or.ok()) {
    Device& device = **device_or;
    void* host = nullptr;
    BENCH_CHECK_CUDA(cudaMallocHost(&host, bytes));
    std::memcpy(host, src, bytes);
    auto dptr = device.Allocate(bytes);
    BENCH_CHECK(dptr.status());
    auto time_lane = [&](Lane lane, const std::function<void()>& fn) {
      std::vector<double> ms;
      for (int i = 0; i < reps + 1; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        BENCH_CHECK(device.SynchronizeLane(lane));
        const auto t1 = std::chrono::steady_clock::now();
        if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      return Median(ms);
    };
    const double dev_h2d_ms = time_lane(
        Lane::kH2D, [&] { BENCH_CHECK(device.CopyToDevice(*dptr, host, bytes, "bench h2d")); });
    rows->push_back({"device_api_h2d", mib, gbps(dev_h2d_ms, bytes), h2d_peak,
                     gbps(dev_h2d_ms, bytes) / h2d_peak, verify(*dptr)});
    const double dev_d2h_ms = time_lane(
        Lane::kD2H, [&] { BENCH_CHECK(device.CopyToHost(host, *dptr, bytes, "bench d2h")); });
    uint64_t diff = 0;
    for (size_t i = 0; i < bytes; ++i) diff += static_cast<unsigned char*>(host)[i] != src[i];
    rows->push_back({"device_api_d2h", mib, gbps(dev_d2h_ms, bytes), d2h_peak,
                     gbps(dev_d2h_ms, bytes) / d2h_peak, diff});
    BENCH_CHECK(device.Free(*dptr));
    cudaFreeHost(host);
  } else {
    std::printf("# strata::Device rows skipped: %s\n", device_or.status().ToString().c_str());
  }
}

// The copy rows: cudaMemcpyAsync at its peak and per block in each direction, from pageable
// memory, both directions at once, then through strata::Device; each checked byte for byte.
std::vector<CopyRow> MeasureCopies(const Config& cfg, GpuModel& model, cudaStream_t stream) {
  const size_t bytes = size_t(cfg.copy_mib) << 20;
  void* pinned = nullptr;
  BENCH_CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  std::vector<unsigned char> pageable(bytes), check(bytes);
  auto* src = static_cast<unsigned char*>(pinned);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 131 + (i >> 12));
  std::memcpy(pageable.data(), src, bytes);
  void* dev = DeviceAlloc(bytes);
  void* dev2 = DeviceAlloc(bytes);
  cudaStream_t stream2;
  BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream2, cudaStreamNonBlocking));
  const int reps = std::max(cfg.iters, 3);
  auto gbps = [&](double ms, size_t moved) { return moved / (ms / 1e3) / 1e9; };
  auto verify = [&](const void* device_copy) -> uint64_t {
    BENCH_CHECK_CUDA(cudaMemcpy(check.data(), device_copy, bytes, cudaMemcpyDeviceToHost));
    uint64_t diff = 0;
    for (size_t i = 0; i < bytes; ++i) diff += check[i] != src[i];
    return diff;
  };
  // Per-block pattern: as many whole blocks as fit in the buffer (at least one).
  auto chunked = [&](size_t chunk, cudaMemcpyKind kind) {
    chunk = std::max<size_t>(1, std::min(chunk, bytes));
    return [&, chunk, kind] {
      for (size_t off = 0; off < bytes; off += chunk) {
        const size_t n = std::min(chunk, bytes - off);
        if (kind == cudaMemcpyHostToDevice) {
          BENCH_CHECK_CUDA(
              cudaMemcpyAsync(static_cast<char*>(dev) + off, src + off, n, kind, stream));
        } else {
          BENCH_CHECK_CUDA(
              cudaMemcpyAsync(src + off, static_cast<char*>(dev) + off, n, kind, stream));
        }
      }
    };
  };
  std::vector<CopyRow> rows;
  const double mib = double(bytes) / (1 << 20);
  const double h2d_peak_ms = TimeMs(stream, 1, reps, [&] {
    BENCH_CHECK_CUDA(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, stream));
  });
  const double h2d_peak = gbps(h2d_peak_ms, bytes);
  rows.push_back({"h2d_pinned_peak", mib, h2d_peak, h2d_peak, 1.0, verify(dev)});
  const double h2d_block_ms =
      TimeMs(stream, 1, reps, chunked(model.BlockParamBytes(), cudaMemcpyHostToDevice));
  rows.push_back({"h2d_per_block", mib, gbps(h2d_block_ms, bytes), h2d_peak,
                  gbps(h2d_block_ms, bytes) / h2d_peak, verify(dev)});
  BENCH_CHECK_CUDA(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice));
  const double d2h_peak_ms = TimeMs(stream, 1, reps, [&] {
    BENCH_CHECK_CUDA(cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, stream));
  });
  const double d2h_peak = gbps(d2h_peak_ms, bytes);
  rows.push_back({"d2h_pinned_peak", mib, d2h_peak, d2h_peak, 1.0, verify(dev)});
  const double d2h_block_ms =
      TimeMs(stream, 1, reps, chunked(model.BlockGradBytes(), cudaMemcpyDeviceToHost));
  rows.push_back({"d2h_per_block", mib, gbps(d2h_block_ms, bytes), d2h_peak,
                  gbps(d2h_block_ms, bytes) / d2h_peak, verify(dev)});
  const double h2d_pageable_ms = TimeMs(stream, 1, reps, [&] {
    BENCH_CHECK_CUDA(cudaMemcpyAsync(dev2, pageable.data(), bytes, cudaMemcpyHostToDevice, stream));
  });
  rows.push_back({"h2d_pageable", mib, gbps(h2d_pageable_ms, bytes), h2d_peak,
                  gbps(h2d_pageable_ms, bytes) / h2d_peak, verify(dev2)});
  // Both directions at once: H2D into dev2 on `stream` while D2H from dev on `stream2`.
  cudaEvent_t fork, join;
  BENCH_CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  void* sink = nullptr;
  BENCH_CHECK_CUDA(cudaMallocHost(&sink, bytes));
  const double bidir_ms = TimeMs(stream, 1, reps, [&] {
    BENCH_CHECK_CUDA(cudaEventRecord(fork, stream));
    BENCH_CHECK_CUDA(cudaStreamWaitEvent(stream2, fork, 0));
    BENCH_CHECK_CUDA(cudaMemcpyAsync(dev2, pinned, bytes, cudaMemcpyHostToDevice, stream));
    BENCH_CHECK_CUDA(cudaMemcpyAsync(sink, dev, bytes, cudaMemcpyDeviceToHost, stream2));
    BENCH_CHECK_CUDA(cudaEventRecord(join, stream2));
    BENCH_CHECK_CUDA(cudaStreamWaitEvent(stream, join, 0));
  });
  rows.push_back({"bidir_pinned", 2 * mib, gbps(bidir_ms, 2 * bytes), h2d_peak + d2h_peak,
                  gbps(bidir_ms, 2 * bytes) / (h2d_peak + d2h_peak), verify(dev2)});
  MeasureDeviceApiCopies(bytes, src, h2d_peak, d2h_peak, reps, verify, &rows);
  cudaFreeHost(sink);
  cudaFreeHost(pinned);
  return rows;
}

int Run(const Config& cfg) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("# gpu_model_bench: no CUDA device present; nothing to measure\n");
    return 0;
  }
  if (cfg.d_model % cfg.heads != 0) {
    std::fprintf(stderr, "error: --d-model %d is not a multiple of --heads %d\n", cfg.d_model,
                 cfg.heads);
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaStream_t stream;
  BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto ctx_or = CudaOpContext::Create(stream);
  BENCH_CHECK(ctx_or.status());
  CudaOpContext& ctx = **ctx_or;
  nlohmann::json doc;
  doc["config"] = {{"layers", cfg.layers},   {"d_model", cfg.d_model}, {"heads", cfg.heads},
                   {"seq_len", cfg.seq_len}, {"batch", cfg.batch},     {"vocab", cfg.vocab},
                   {"iters", cfg.iters},     {"warmup", cfg.warmup},   {"copy_mib", cfg.copy_mib},
                   {"device", prop.name},    {"cuda_runtime", runtime}};

  // ---- model -------------------------------------------------------------------------------
  GpuModel model(cfg, ctx);
  const ModelOutcome outcome = MeasureModel(cfg, prop, runtime, ctx, model, stream, &doc);
  const int wrong_model = outcome.wrong_model, wrong_kernels = outcome.wrong_kernels;

  if (cfg.model_only) {
    if (!WriteJson(cfg.json, doc)) return 1;
    return wrong_model != 0 || wrong_kernels != 0 ? 1 : 0;
  }

  // ---- copies ------------------------------------------------------------------------------
  const size_t bytes = size_t(cfg.copy_mib) << 20;
  const double mib = double(bytes) / (1 << 20);
  const std::vector<CopyRow> rows = MeasureCopies(cfg, model, stream);
  std::printf(
      "# copies: %.0f MiB per case; per_block = %.2f MiB bf16 params (H2D) / %.2f MiB"
      " fp32 grads (D2H) per cudaMemcpyAsync; ratio = GB/s / peak of that direction\n",
      mib, model.BlockParamBytes() / 1048576.0, model.BlockGradBytes() / 1048576.0);
  std::printf("%-16s %10s %10s %10s %7s %7s\n", "#case", "size_MiB", "GB/s", "peak_GB/s", "ratio",
              "#wrong");
  nlohmann::json copies = nlohmann::json::array();
  for (const CopyRow& r : rows) {
    std::printf("%-16s %10.1f %10.2f %10.2f %7.3f %7llu\n", r.name.c_str(), r.mib, r.gbps, r.peak,
                r.ratio, static_cast<unsigned long long>(r.wrong));
    copies.push_back({{"case", r.name},
                      {"size_mib", r.mib},
                      {"gb_per_s", r.gbps},
                      {"peak_gb_per_s", r.peak},
                      {"ratio", r.ratio},
                      {"wrong", r.wrong}});
  }
  doc["copies"] = copies;
  if (!WriteJson(cfg.json, doc)) return 1;
  bool any_wrong = wrong_model != 0 || wrong_kernels != 0;
  for (const CopyRow& r : rows) any_wrong = any_wrong || r.wrong != 0;
  return any_wrong ? 1 : 0;
}

}  // namespace
}  // namespace strata::model::cuda_ops

int main(int argc, char** argv) {
  strata::model::cuda_ops::Config cfg;
  CLI::App app{"GPT-2 forward+backward tokens/s on one GPU and host<->device bandwidth"};
  app.add_option("--layers", cfg.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--d-model", cfg.d_model, "channels C")->check(CLI::PositiveNumber);
  app.add_option("--heads", cfg.heads, "attention heads (must divide --d-model)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seq-len", cfg.seq_len, "tokens per row T")->check(CLI::PositiveNumber);
  app.add_option("--batch", cfg.batch, "rows per step B")->check(CLI::PositiveNumber);
  app.add_option("--vocab", cfg.vocab, "vocabulary size V")->check(CLI::PositiveNumber);
  app.add_option("--iters", cfg.iters, "timed repetitions (the median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", cfg.warmup, "untimed repetitions first")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--copy-mib", cfg.copy_mib, "MiB per copy case")->check(CLI::PositiveNumber);
  app.add_option("--json", cfg.json, "also write the results as JSON to this file");
  app.add_flag("!--no-naive", cfg.naive,
               "skip timing the previous (naive) kernels against the tuned ones");
  app.add_flag("--model-only", cfg.model_only, "skip the copy cases");
  bool query = false;
  app.add_flag("--query", query,
               "print the CUDA devices, driver and runtime versions as one JSON line and exit "
               "(3 when no device is present)");
  CLI11_PARSE(app, argc, argv);
  if (query) return strata::model::cuda_ops::Query();
  return strata::model::cuda_ops::Run(cfg);
}
