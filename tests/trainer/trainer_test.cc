// The Trainer and the engine driver against PlainEngine (plain buffers): the driver feeds
// the engine exactly the gradient of the plain forward/backward, the loss falls on the
// built-in corpus, micro-batches average, and the learning-rate schedule.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <chrono>

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

// Fails mid-backward, right after a slow kernel was queued ahead of the model's closures: the
// closures of the failed step are still queued when the error comes back.
class FailingEngine : public PlainEngine {
 public:
  FailingEngine(const std::vector<BlockSpec>& specs, const EngineOptions& o, int fail_block)
      : PlainEngine(specs, o), device_(o.device), fail_block_(fail_block) {}
  Result<BlockView> Acquire(int b, Pass pass) override {
    if (pass == Pass::kBackward && b == fail_block_) {
      (void)device_->EnqueueBusy(Lane::kCompute, kSlow, "slow kernel");
    }
    return PlainEngine::Acquire(b, pass);
  }
  Status SubmitGrads(int b) override {
    if (b == fail_block_) return Status::IOError("injected: writing the block's gradients failed");
    return PlainEngine::SubmitGrads(b);
  }
  static constexpr std::chrono::milliseconds kSlow{300};

 private:
  Device* device_;
  int fail_block_;
};

// A step that fails part-way returns only after the model's closures it queued have run or
// been skipped: they write the step's losses and read its tokens, which die with the step
// (a use-after-free, SIGSEGV after the error message, before the fix; ASan names it).
TEST(Trainer, FailedStepDrainsTheComputeLaneBeforeReturning) {
  Gpt2Config cfg;
  cfg.layers = 2;
  cfg.d_model = 32;
  cfg.heads = 2;
  cfg.max_seq = 32;
  TrainOptions opt;
  opt.seq_len = 32;
  opt.batch = 4;
  auto d = CreateHostDevice({});
  ASSERT_TRUE(d.ok());
  std::unique_ptr<Device> device = std::move(d).value();
  EngineOptions eo;
  eo.device = device.get();
  auto engine =
      std::make_unique<FailingEngine>(Gpt2BlockSpecs(cfg), eo, /*fail_block=*/cfg.layers + 1);
  TokenStream data = DefaultCorpus();
  auto batcher = Batcher::Create(&data, opt.batch, opt.seq_len);
  ASSERT_TRUE(batcher.ok());
  auto trainer = std::make_unique<Trainer>(engine.get(), device.get(), cfg, opt, &*batcher);
  ASSERT_TRUE(trainer->InitWeights(nullptr, 5).ok());
  const auto start = std::chrono::steady_clock::now();
  auto r = trainer->Step();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected"), std::string::npos) << r.status().ToString();
  EXPECT_GE(elapsed, FailingEngine::kSlow) << "Step returned with its closures still queued";
  trainer.reset();
  engine.reset();
  EXPECT_TRUE(device->SynchronizeLane(Lane::kCompute).ok());
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
