// The Trainer and the engine driver against PlainEngine (plain buffers): the driver feeds
// the engine exactly the gradient of the plain forward/backward, the loss falls on the
// built-in corpus, micro-batches average, and the learning-rate schedule.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include "tests/trainer/plain_engine.h"

namespace strata::model {
namespace {

using trainer::ForwardBackwardEngine;
using trainer::LearningRate;
using trainer::LrSchedule;
using trainer::ReadWeights;
using trainer::StepResult;
using trainer::Trainer;
using trainer::TrainOptions;

struct Rig {
  Gpt2Config cfg;
  TrainOptions opt;
  std::unique_ptr<Device> device;
  std::unique_ptr<PlainEngine> engine;
  TokenStream data = DefaultCorpus();
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<Trainer> trainer;
  Rig(int micro_batches, int batch) {
    cfg.layers = 2;
    cfg.d_model = 32;
    cfg.heads = 2;
    cfg.max_seq = 32;
    opt.seq_len = 32;
    opt.batch = batch;
    opt.micro_batches = micro_batches;
    opt.lr = 3e-3;
    auto d = CreateHostDevice({});
    EXPECT_TRUE(d.ok());
    device = std::move(d).value();
    EngineOptions eo;
    eo.device = device.get();
    eo.beta1 = 0.9;
    eo.beta2 = 0.95;
    eo.weight_decay = 0.1;
    eo.grad_clip = 1.0;
    eo.micro_batches = micro_batches;
    engine = std::make_unique<PlainEngine>(Gpt2BlockSpecs(cfg), eo);
    auto b = Batcher::Create(&data, batch, opt.seq_len);
    EXPECT_TRUE(b.ok());
    batcher = std::make_unique<Batcher>(*b);
    trainer = std::make_unique<Trainer>(engine.get(), device.get(), cfg, opt, batcher.get());
    EXPECT_TRUE(trainer->InitWeights(nullptr, 5).ok());
  }
};

TEST(Trainer, EngineDriverGivesThePlainGradient) {
  Rig s(1, 4);
  const auto& layouts = s.engine->Layout();
  HostWeights w = *s.trainer->Weights();
  std::vector<std::vector<float>> g;
  std::vector<float*> gp;
  for (const auto& l : layouts) g.emplace_back(l.padded_numel, 0.f);
  for (auto& x : g) gp.push_back(x.data());
  // Plain buffers in the engine's layout.
  std::vector<std::vector<float>> p;
  std::vector<const float*> pp;
  for (size_t b = 0; b < layouts.size(); ++b) {
    p.emplace_back(layouts[b].padded_numel);
    ASSERT_TRUE(s.engine->ReadComponent(b, Component::kMaster, p.back()).ok());
  }
  for (auto& x : p) pp.push_back(x.data());
  const int N = 4 * 32;
  std::vector<int32_t> in(N), tg(N);
  s.batcher->TrainBatch(0, in.data(), tg.data());
  Gpt2Model<float> m(s.cfg, 4, 32, false);
  const double plain = ForwardBackwardPlain(m, layouts, pp, gp, in.data(), tg.data(), 1.0f / N);
  auto r = s.trainer->Step();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->loss, plain);
  for (size_t b = 0; b < layouts.size(); ++b) {
    std::vector<float> acc(layouts[b].padded_numel);
    ASSERT_TRUE(s.engine->ReadComponent(b, Component::kGrad, acc).ok());
    for (const TensorLayout& tl : layouts[b].tensors) {
      EXPECT_EQ(0, std::memcmp(acc.data() + tl.offset, g[b].data() + tl.offset, tl.numel * 4))
          << layouts[b].name << "." << tl.name;
    }
  }
  (void)w;
}

TEST(Trainer, LossFallsOnTheBuiltInCorpus) {
  Rig s(2, 4);
  double first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = s.trainer->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(std::isfinite(r->loss));
    if (i == 0) first = r->loss;
    last = r->loss;
  }
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // uniform at initialisation
  EXPECT_LT(last, 0.7 * first);
  auto val = s.trainer->ValidationLoss();
  ASSERT_TRUE(val.ok());
  EXPECT_LT(*val, 0.75 * first);
  auto w = s.trainer->Weights();
  ASSERT_TRUE(w.ok());
  const std::string text = "The ";
  std::vector<int32_t> prompt(text.begin(), text.end());
  const auto out = Generate(s.cfg, *w, prompt, 20, SamplingOptions{});
  EXPECT_EQ(out.size(), prompt.size() + 20);
  for (int32_t t : out) EXPECT_TRUE(t >= 0 && t < 256);
}

TEST(Trainer, LearningRateSchedule) {
  TrainOptions o;
  o.lr = 1.0;
  o.warmup = 10;
  o.steps = 110;
  EXPECT_DOUBLE_EQ(LearningRate(o, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 50), 1.0);
  o.schedule = LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(LearningRate(o, 10), 1.0);
  EXPECT_NEAR(LearningRate(o, 60), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 110), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(o, 200), 0.1, 1e-12);
}

}  // namespace
}  // namespace strata::model
