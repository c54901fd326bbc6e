// The whole model: gradient against finite differences (float64, tiny config), recompute
// equals no-recompute bit for bit, float agrees with double, initialisation and weights
// round trip through safetensors; micro-batches in slots, interleaved block by block, equal
// their separate runs.
#include "model/gpt2.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace strata::model {
namespace {

Gpt2Config Tiny() {
  Gpt2Config c;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.max_seq = 6;
  c.vocab = 11;
  return c;
}

template <typename F>
struct Weights {
  std::vector<BlockSpec> specs;
  std::vector<BlockLayout> layouts;
  std::vector<std::vector<F>> p, g;
  Weights(const Gpt2Config& cfg, uint64_t seed, uint32_t align = 1) {
    specs = Gpt2BlockSpecs(cfg);
    layouts = PlainLayout(specs, align);
    for (size_t b = 0; b < specs.size(); ++b) {
      p.emplace_back(layouts[b].padded_numel, F(0));
      g.emplace_back(layouts[b].padded_numel, F(-7));  // backward must overwrite it
      for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
        const TensorLayout& tl = layouts[b].tensors[t];
        std::vector<float> v(tl.numel);
        InitTensor(cfg, specs, static_cast<int>(b), static_cast<int>(t), seed, v);
        // Perturb biases and LayerNorm params so their grads are not trivially symmetric.
        std::mt19937_64 rng(seed + b * 100 + t);
        std::normal_distribution<double> nd(0, 0.1);
        for (size_t i = 0; i < v.size(); ++i) {
          p[b][tl.offset + i] = static_cast<F>(v[i]) * F(10) + static_cast<F>(nd(rng));
        }
      }
    }
  }
  std::vector<const F*> P() const {
    std::vector<const F*> r;
    for (auto& x : p) r.push_back(x.data());
    return r;
  }
  std::vector<F*> G() {
    std::vector<F*> r;
    for (auto& x : g) r.push_back(x.data());
    return r;
  }
};

void Tokens(const Gpt2Config& cfg, int n, uint64_t seed, std::vector<int32_t>* in,
            std::vector<int32_t>* tgt) {
  std::mt19937_64 rng(seed);
  in->resize(n);
  tgt->resize(n);
  for (int i = 0; i < n; ++i) {
    (*in)[i] = static_cast<int32_t>(rng() % cfg.vocab);
    (*tgt)[i] = static_cast<int32_t>(rng() % cfg.vocab);
  }
}

TEST(Gpt2Model, WholeModelGradientMatchesFiniteDifferences) {
  const Gpt2Config cfg = Tiny();
  const int B = 2, T = 5;  // T < max_seq: wpe rows beyond T get zero grad
  Weights<double> w(cfg, 3);
  std::vector<int32_t> in, tgt;
  Tokens(cfg, B * T, 5, &in, &tgt);
  Gpt2Model<double> m(cfg, B, T, /*recompute=*/false);
  const double dloss = 1.0 / (B * T);
  ForwardBackwardPlain(m, w.layouts, w.P(), w.G(), in.data(), tgt.data(), dloss);
  Gpt2Model<double> f(cfg, B, T, false);
  auto loss = [&] { return ForwardPlain(f, w.layouts, w.P(), in.data(), tgt.data()); };
  const double h = 1e-5;
  int checked = 0;
  for (size_t b = 0; b < w.specs.size(); ++b) {
    for (const TensorLayout& tl : w.layouts[b].tensors) {
      // Every element of small tensors, a spread of elements of large ones.
      const uint64_t stride = tl.numel > 64 ? 7 : 1;
      for (uint64_t i = 0; i < tl.numel; i += stride) {
        double& x = w.p[b][tl.offset + i];
        const double saved = x;
        x = saved + h;
        const double lp = loss();
        x = saved - h;
        const double lm = loss();
        x = saved;
        const double fd = (lp - lm) / (2 * h);
        const double an = w.g[b][tl.offset + i];
        ASSERT_NEAR(fd, an, 1e-6 + 1e-5 * std::abs(fd))
            << w.specs[b].name << "." << tl.name << "[" << i << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(Gpt2Model, RecomputeIsBitIdentical) {
  Gpt2Config cfg = Tiny();
  cfg.layers = 3;
  const int B = 3, T = 6;
  Weights<float> a(cfg, 9, 16), b(cfg, 9, 16);
  std::vector<int32_t> in, tgt;
  Tokens(cfg, B * T, 1, &in, &tgt);
  Gpt2Model<float> plain(cfg, B, T, false), re(cfg, B, T, true);
  const double l1 =
      ForwardBackwardPlain(plain, a.layouts, a.P(), a.G(), in.data(), tgt.data(), 1.0f / (B * T));
  const double l2 =
      ForwardBackwardPlain(re, b.layouts, b.P(), b.G(), in.data(), tgt.data(), 1.0f / (B * T));
  EXPECT_EQ(l1, l2);
  for (size_t k = 0; k < a.g.size(); ++k) {
    for (const TensorLayout& tl : a.layouts[k].tensors) {
      EXPECT_EQ(0, std::memcmp(a.g[k].data() + tl.offset, b.g[k].data() + tl.offset,
                               tl.numel * sizeof(float)))
          << a.specs[k].name << "." << tl.name;
    }
  }
}

TEST(Gpt2Model, FloatAgreesWithDoubleAndThreadCountDoesNotMatter) {
  Gpt2Config cfg = Tiny();
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.max_seq = 16;
  cfg.vocab = 50;
  const int B = 2, T = 16;
  Weights<float> wf(cfg, 4);
  Weights<double> wd(cfg, 4);
  std::vector<int32_t> in, tgt;
  Tokens(cfg, B * T, 2, &in, &tgt);
  Gpt2Model<float> mf(cfg, B, T, false);
  Gpt2Model<double> md(cfg, B, T, false);
  const double lf =
      ForwardBackwardPlain(mf, wf.layouts, wf.P(), wf.G(), in.data(), tgt.data(), 1.0f / (B * T));
  const double ld =
      ForwardBackwardPlain(md, wd.layouts, wd.P(), wd.G(), in.data(), tgt.data(), 1.0 / (B * T));
  EXPECT_NEAR(lf, ld, 1e-4 * ld);
  for (size_t k = 0; k < wf.g.size(); ++k) {
    double num = 0, den = 0;
    for (size_t i = 0; i < wf.g[k].size(); ++i) {
      num += std::pow(wf.g[k][i] - wd.g[k][i], 2);
      den += std::pow(wd.g[k][i], 2);
    }
    // fp32 rounding only (the math itself is checked in double against finite differences):
    // the tied embedding sums B*T head contributions, and how a compiler vectorises those
    // sums (-O3 vs the sanitizer build's -O2) moves its error around 1e-4.
    EXPECT_LT(std::sqrt(num / (den + 1e-30)), 5e-4) << wf.specs[k].name;
  }
  // One thread vs two: the same bits.
  const int saved = omp_get_max_threads();
  Weights<float> w1(cfg, 4), w2(cfg, 4);
  omp_set_num_threads(1);
  Gpt2Model<float> m1(cfg, B, T, false);
  const double l1 =
      ForwardBackwardPlain(m1, w1.layouts, w1.P(), w1.G(), in.data(), tgt.data(), 1.0f / (B * T));
  omp_set_num_threads(2);
  Gpt2Model<float> m2(cfg, B, T, false);
  const double l2 =
      ForwardBackwardPlain(m2, w2.layouts, w2.P(), w2.G(), in.data(), tgt.data(), 1.0f / (B * T));
  omp_set_num_threads(saved);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(w1.g, w2.g);
}

// Several micro-batches in flight, one slot each, interleaved block by block (layer-major):
// each slot's loss and every block's gradient equal those of its micro-batch run alone, with
// and without recompute (the slots share scratch, never saved state).
TEST(Gpt2Model, SlotsInterleavedBlockByBlockEqualSeparateRuns) {
  Gpt2Config cfg = Tiny();
  const int B = 2, T = 5, M = 3, L = cfg.layers;
  for (const bool recompute : {false, true}) {
    Weights<float> w(cfg, 9);
    std::vector<std::vector<int32_t>> in(M), tgt(M);
    for (int m = 0; m < M; ++m) Tokens(cfg, B * T, 20 + m, &in[m], &tgt[m]);
    // Alone: one model per micro-batch, the gradient of each block kept per micro-batch.
    std::vector<double> loss_alone(M);
    std::vector<std::vector<std::vector<float>>> g_alone(M);
    for (int m = 0; m < M; ++m) {
      Gpt2Model<float> one(cfg, B, T, recompute);
      loss_alone[m] = ForwardBackwardPlain(one, w.layouts, w.P(), w.G(), in[m].data(),
                                           tgt[m].data(), 1.0f / (B * T));
      g_alone[m] = w.g;
    }
    Gpt2Model<float> slots(cfg, B, T, recompute, M);
    ASSERT_EQ(slots.micro_slots(), M);
    auto ptrs = [&](int b) { return BlockPtrs<float>{w.P()[b], w.G()[b], &w.layouts[b]}; };
    for (int m = 0; m < M; ++m) {
      slots.UseSlot(m);
      slots.SetTokens(in[m].data(), tgt[m].data());
    }
    for (int b = 0; b <= L + 1; ++b) {
      for (int m = 0; m < M; ++m) {
        slots.UseSlot(m);
        if (b == 0) slots.EmbedForward(ptrs(b));
        if (b >= 1 && b <= L) slots.LayerForward(b - 1, ptrs(b));
        if (b == L + 1) slots.FinalForward(ptrs(b));
      }
    }
    for (int b = L + 1; b >= 0; --b) {
      for (int m = 0; m < M; ++m) {
        slots.UseSlot(m);
        if (b == L + 1) {
          EXPECT_EQ(slots.Head(/*backward=*/true, 1.0f / (B * T)), loss_alone[m]);
          slots.FinalBackward(ptrs(b));
        }
        if (b >= 1 && b <= L) slots.LayerBackward(b - 1, ptrs(b));
        if (b == 0) slots.EmbedBackward(ptrs(b));
        EXPECT_EQ(w.g[b], g_alone[m][b])
            << "block " << b << ", micro-batch " << m << (recompute ? ", recompute" : "");
      }
    }
  }
}

TEST(Gpt2Model, SavedActivationBytesCountsWhatASlotKeeps) {
  Gpt2Config cfg = Tiny();
  const int64_t B = 2, T = 5, N = B * T, C = cfg.d_model, L = cfg.layers, V = cfg.vocab;
  // Tokens, block inputs, final LayerNorm (+ mean, rstd), dres, the head's wte gradient.
  const int64_t kept = 2 * N + (L + 1) * N * C + (N * C + 2 * N) + N * C + V * C;
  EXPECT_EQ(SavedActivationBytes(cfg, B, T, true), uint64_t(4 * kept));
  const int64_t per_layer = 15 * N * C + 4 * N + B * cfg.heads * T * T;
  EXPECT_EQ(SavedActivationBytes(cfg, B, T, false), uint64_t(4 * (kept + L * per_layer)));
  cfg.d_model = cfg.heads = 1 << 30;
  EXPECT_EQ(SavedActivationBytes(cfg, int64_t(1) << 40, T, false), UINT64_MAX);
}

TEST(Gpt2Model, InitIsDeterministicAndHasGpt2Statistics) {
  Gpt2Config cfg;
  cfg.layers = 8;
  cfg.d_model = 64;
  const auto specs = Gpt2BlockSpecs(cfg);
  EXPECT_EQ(specs.size(), 10u);
  EXPECT_EQ(HfTensorName(specs, 3, kAttnW), "h.2.attn.c_attn.weight");
  EXPECT_EQ(HfTensorName(specs, 0, kWte), "wte.weight");
  EXPECT_EQ(HfTensorName(specs, 9, kLnfB), "ln_f.bias");
  EXPECT_FALSE(specs[1].tensors[kAttnB].weight_decay);
  EXPECT_FALSE(specs[1].tensors[kLn1W].weight_decay);
  EXPECT_TRUE(specs[1].tensors[kFcW].weight_decay);
  EXPECT_TRUE(specs[0].tensors[kWpe].weight_decay);
  std::vector<float> a(64 * 256), b(64 * 256), proj(256 * 64), ln(64);
  InitTensor(cfg, specs, 2, kFcW, 42, a);
  InitTensor(cfg, specs, 2, kFcW, 42, b);
  EXPECT_EQ(a, b);
  InitTensor(cfg, specs, 2, kFcW, 43, b);
  EXPECT_NE(a, b);
  InitTensor(cfg, specs, 2, kFcProjW, 42, proj);
  InitTensor(cfg, specs, 2, kLn2W, 42, ln);
  auto stddev = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / v.size());
  };
  EXPECT_NEAR(stddev(a), 0.02, 0.001);
  EXPECT_NEAR(stddev(proj), 0.02 / std::sqrt(16.0), 0.0003);
  EXPECT_EQ(ln, std::vector<float>(64, 1.0f));
  EXPECT_EQ(Gpt2NumParams(cfg), 256u * 64 + 64u * 64 + 8u * (12u * 64 * 64 + 13u * 64) + 128);
}

// The model FLOPs per token: 6 per parameter, the attention products, and a recomputed
// forward of the layers. GPT-2 small at T 1024: 6 x 124.4M + 12 x 12 x 1024 x 768.
TEST(Gpt2Model, TrainFlopsPerToken) {
  Gpt2Config cfg;
  cfg.layers = 8;
  cfg.d_model = 64;
  const double P = double(Gpt2NumParams(cfg));
  const double layers = 8.0 * (12.0 * 64 * 64 + 13.0 * 64);
  EXPECT_DOUBLE_EQ(Gpt2TrainFlopsPerToken(cfg, 32, false), 6 * P + 12.0 * 8 * 32 * 64);
  EXPECT_DOUBLE_EQ(Gpt2TrainFlopsPerToken(cfg, 32, true),
                   6 * P + 12.0 * 8 * 32 * 64 + 2 * layers + 4.0 * 8 * 32 * 64);
  Gpt2Config small;
  small.layers = 12, small.d_model = 768, small.heads = 12, small.vocab = 50257,
  small.max_seq = 1024;
  EXPECT_NEAR(Gpt2TrainFlopsPerToken(small, 1024, false) / 1e9, 0.8599, 0.001);
}

// The geometry SaveWeights records comes back without being given; metadata that
// contradicts the tensors is refused; without n_head the one default rule applies.
TEST(Gpt2Model, GeometryMetadataRoundTrips) {
  Gpt2Config cfg = Tiny();
  cfg.heads = cfg.d_model / 4;
  ASSERT_NE(cfg.heads, DefaultHeads(cfg.d_model));
  Weights<float> w(cfg, 11, 16);
  HostWeights hw;
  hw.layouts = w.layouts;
  hw.blocks = w.p;
  char tmpl[] = "/tmp/strata-gpt2-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(SaveWeights(dir + "/m.safetensors", w.specs, hw, GeometryMetadata(cfg)).ok());
  auto f = SafetensorsReader::Open(dir + "/m.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  auto c = ConfigFromSafetensors(*f, 0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->heads, cfg.heads);
  EXPECT_EQ(c->layers, cfg.layers);

  auto meta = GeometryMetadata(cfg);
  meta["n_layer"] = std::to_string(cfg.layers + 1);
  ASSERT_TRUE(SaveWeights(dir + "/bad.safetensors", w.specs, hw, meta).ok());
  auto bad = SafetensorsReader::Open(dir + "/bad.safetensors");
  ASSERT_TRUE(bad.ok());
  auto refused = ConfigFromSafetensors(*bad, 0);
  ASSERT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.status().message().find("n_layer"), std::string::npos);

  ASSERT_TRUE(SaveWeights(dir + "/plain.safetensors", w.specs, hw).ok());
  auto plain = SafetensorsReader::Open(dir + "/plain.safetensors");
  ASSERT_TRUE(plain.ok());
  auto d = ConfigFromSafetensors(*plain, 0);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->heads, DefaultHeads(cfg.d_model));
  EXPECT_EQ(DefaultHeads(768), 12);
  EXPECT_EQ(DefaultHeads(96), 1);
  EXPECT_EQ(0, std::system(("rm -rf " + dir).c_str()));
}

TEST(Gpt2Model, WeightsRoundTripThroughSafetensors) {
  const Gpt2Config cfg = Tiny();
  Weights<float> w(cfg, 11, 16);
  HostWeights hw;
  hw.layouts = w.layouts;
  hw.blocks = w.p;
  char tmpl[] = "/tmp/strata-gpt2-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/m.safetensors";
  ASSERT_TRUE(SaveWeights(path, w.specs, hw).ok());
  auto f = SafetensorsReader::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto cfg2 = ConfigFromSafetensors(*f, cfg.heads);
  ASSERT_TRUE(cfg2.ok()) << cfg2.status().ToString();
  EXPECT_EQ(cfg2->layers, cfg.layers);
  EXPECT_EQ(cfg2->d_model, cfg.d_model);
  EXPECT_EQ(cfg2->max_seq, cfg.max_seq);
  EXPECT_EQ(cfg2->vocab, cfg.vocab);
  for (size_t b = 0; b < w.specs.size(); ++b) {
    for (size_t t = 0; t < w.specs[b].tensors.size(); ++t) {
      const TensorLayout& tl = w.layouts[b].tensors[t];
      std::vector<float> v(tl.numel);
      ASSERT_TRUE(LoadTensor(*f, w.specs, b, t, v).ok());
      EXPECT_EQ(0, std::memcmp(v.data(), w.p[b].data() + tl.offset, tl.numel * 4));
    }
  }
  // A file of a different shape: the error names the tensor and both shapes.
  Gpt2Config other = cfg;
  other.d_model = 12;
  other.heads = 3;
  const auto specs2 = Gpt2BlockSpecs(other);
  std::vector<float> v(12 * 36);
  Status s = LoadTensor(*f, specs2, 1, kAttnW, v);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("h.0.attn.c_attn.weight in " + path +
                             " has shape [8, 24], expected [12, 36]"),
            std::string::npos)
      << s.ToString();
  EXPECT_EQ(0, std::system(("rm -rf " + std::string(tmpl)).c_str()));
}

}  // namespace
}  // namespace strata::model

namespace strata::model {
namespace {

// A file laid out like Hugging Face's GPT-2 export: "transformer." prefixes, attn.bias and
// attn.masked_bias buffers, BF16 weights.
TEST(Gpt2Model, ReadsHuggingFaceStyleFiles) {
  Gpt2Config cfg;
  cfg.layers = 1;
  cfg.d_model = 8;
  cfg.heads = 2;
  cfg.max_seq = 12;
  cfg.vocab = 5;
  const auto specs = Gpt2BlockSpecs(cfg);
  char tmpl[] = "/tmp/strata-hf-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/hf.safetensors";
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float fill) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    header[name] = {
        {"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + 2 * n}}};
    uint32_t bits;
    std::memcpy(&bits, &fill, 4);
    for (int64_t i = 0; i < n; ++i) {
      data.push_back(static_cast<char>((bits >> 16) & 0xff));
      data.push_back(static_cast<char>(bits >> 24));
    }
  };
  for (size_t b = 0; b < specs.size(); ++b) {
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      add("transformer." + HfTensorName(specs, b, t), specs[b].tensors[t].shape,
          0.5f + static_cast<float>(b * 16 + t));
    }
  }
  add("transformer.h.0.attn.bias", {1, 1, 12, 12}, 1.0f);
  add("transformer.h.0.attn.masked_bias", {1}, -1e4f);
  const std::string h = header.dump();
  {
    std::ofstream f(path, std::ios::binary);
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << h << data;
  }
  auto f = SafetensorsReader::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto c = ConfigFromSafetensors(*f, 2);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layers, 1);
  EXPECT_EQ(c->max_seq, 12);
  EXPECT_EQ(c->vocab, 5);
  std::vector<float> v(8 * 24);
  ASSERT_TRUE(LoadTensor(*f, specs, 1, kAttnW, v).ok());
  EXPECT_EQ(v[7], 0.5f + 16 + static_cast<float>(int(kAttnW)));
  EXPECT_EQ(0, std::system(("rm -rf " + std::string(tmpl)).c_str()));
}

// The model's distribution of the token after `prompt`, from the loss (not from logits()):
// the loss with target v at the last position is -log p(v) plus terms that do not depend
// on v, so p(v)^(1/T) normalised is what sampling at temperature T must follow.
std::vector<double> NextTokenDistribution(const Gpt2Config& cfg, const Weights<float>& w,
                                          const std::vector<int32_t>& prompt, double T) {
  const int n = static_cast<int>(prompt.size());
  Gpt2Model<float> m(cfg, 1, n, false);
  std::vector<double> logp(cfg.vocab);
  std::vector<int32_t> targets(n, 0);
  for (int v = 0; v < cfg.vocab; ++v) {
    targets[n - 1] = v;
    logp[v] = -n * ForwardPlain(m, w.layouts, w.P(), prompt.data(), targets.data());
  }
  const double mx = *std::max_element(logp.begin(), logp.end());
  std::vector<double> p(cfg.vocab);
  double sum = 0;
  for (int v = 0; v < cfg.vocab; ++v) sum += p[v] = std::exp((logp[v] - mx) / T);
  for (double& x : p) x /= sum;
  return p;
}

// Pearson's chi-square of `counts` against `p` (cells with p == 0 must be empty).
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi2 = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] == 0) {
      EXPECT_EQ(counts[v], 0) << "token " << v << " is outside the kept set";
      continue;
    }
    const double e = p[v] * n;
    chi2 += (counts[v] - e) * (counts[v] - e) / e;
  }
  return chi2;
}

TEST(Generate, SamplingFollowsTheModelsDistribution) {
  const Gpt2Config cfg = Tiny();  // vocab 11: chi-square with 10 degrees of freedom
  Weights<float> w(cfg, 5);
  HostWeights hw;
  hw.layouts = w.layouts;
  for (const auto& b : w.p) hw.blocks.emplace_back(b.begin(), b.end());
  const std::vector<int32_t> prompt = {3, 1, 4};
  constexpr int kDraws = 4000;
  for (double T : {1.0, 0.6}) {
    const std::vector<double> p = NextTokenDistribution(cfg, w, prompt, T);
    // A peaked distribution, so that sampling from anything else (softmax of
    // probabilities, which is near uniform) would be far off.
    ASSERT_GT(*std::max_element(p.begin(), p.end()), 3.0 / cfg.vocab);
    std::vector<int> counts(cfg.vocab, 0);
    for (int i = 0; i < kDraws; ++i) {
      SamplingOptions s;
      s.temperature = T;
      s.seed = 1000 + i;  // fixed seeds: the test is deterministic
      const auto out = Generate(cfg, hw, prompt, 1, s);
      ASSERT_EQ(out.size(), prompt.size() + 1);
      ++counts[out.back()];
    }
    // 10 degrees of freedom: P(chi2 > 35.6) = 1e-4 for the right distribution.
    EXPECT_LT(ChiSquare(counts, p, kDraws), 35.6) << "temperature " << T;
  }
}

TEST(Generate, TopKAndTopPSampleOnlyTheKeptTokensInProportion) {
  const Gpt2Config cfg = Tiny();
  Weights<float> w(cfg, 5);
  HostWeights hw;
  hw.layouts = w.layouts;
  for (const auto& b : w.p) hw.blocks.emplace_back(b.begin(), b.end());
  const std::vector<int32_t> prompt = {3, 1, 4};
  const std::vector<double> full = NextTokenDistribution(cfg, w, prompt, 1.0);
  std::vector<int> order(cfg.vocab);
  for (int v = 0; v < cfg.vocab; ++v) order[v] = v;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return full[x] > full[y]; });
  struct Case {
    int top_k;
    double top_p;
    int kept;  // how many of the most probable tokens remain
  };
  int reach = 0;  // tokens needed to reach 60% of the mass
  for (double mass = 0; mass < 0.6;) mass += full[order[reach++]];
  ASSERT_LT(reach, cfg.vocab);
  for (const Case& c : {Case{3, 1.0, 3}, Case{0, 0.6, reach}, Case{1, 1.0, 1}}) {
    std::vector<double> p(cfg.vocab, 0.0);
    double kept = 0;
    for (int i = 0; i < c.kept; ++i) kept += full[order[i]];
    for (int i = 0; i < c.kept; ++i) p[order[i]] = full[order[i]] / kept;
    constexpr int kDraws = 2000;
    std::vector<int> counts(cfg.vocab, 0);
    for (int i = 0; i < kDraws; ++i) {
      SamplingOptions s;
      s.temperature = 1.0;
      s.top_k = c.top_k;
      s.top_p = c.top_p;
      s.seed = 7 + i;
      ++counts[Generate(cfg, hw, prompt, 1, s).back()];
    }
    // c.kept - 1 degrees of freedom (at most 10): 35.6 is a P = 1e-4 bound or looser.
    EXPECT_LT(ChiSquare(counts, p, kDraws), 35.6) << "top-k " << c.top_k << " top-p " << c.top_p;
  }
}

TEST(Generate, SamplingDistributionCutsAndRenormalises) {
  const std::vector<float> logits = {0.0f, std::log(4.0f), std::log(2.0f), std::log(2.0f), 0.0f};
  // softmax: 1/10, 4/10, 2/10, 2/10, 1/10.
  SamplingOptions s;
  s.temperature = 1;
  auto p = SamplingDistribution(logits, s);
  EXPECT_NEAR(p[1], 0.4, 1e-6);
  EXPECT_NEAR(p[4], 0.1, 1e-6);
  s.top_k = 2;  // tokens 1 and 2 (the tie 2/3 goes to the lower id)
  p = SamplingDistribution(logits, s);
  EXPECT_NEAR(p[1], 4.0 / 6, 1e-6);
  EXPECT_NEAR(p[2], 2.0 / 6, 1e-6);
  EXPECT_EQ(p[3], 0.0);
  s.top_k = 0;
  s.top_p = 0.7;  // 0.4 + 0.2 = 0.6 < 0.7, + 0.2 = 0.8: three tokens
  p = SamplingDistribution(logits, s);
  EXPECT_NEAR(p[1], 0.5, 1e-6);
  EXPECT_NEAR(p[3], 0.25, 1e-6);
  EXPECT_EQ(p[0], 0.0);
  s.top_p = 1;
  s.temperature = 0.5;  // squares the probabilities: 1, 16, 4, 4, 1 over 26
  p = SamplingDistribution(logits, s);
  EXPECT_NEAR(p[1], 16.0 / 26, 1e-6);
  s.temperature = 0;  // greedy
  p = SamplingDistribution(logits, s);
  EXPECT_EQ(p[1], 1.0);
  EXPECT_FALSE(SamplingOptions{.top_p = 0}.Validate().ok());
  EXPECT_FALSE(SamplingOptions{.top_k = -1}.Validate().ok());
  EXPECT_FALSE(SamplingOptions{.temperature = -1}.Validate().ok());
}

}  // namespace
}  // namespace strata::model
