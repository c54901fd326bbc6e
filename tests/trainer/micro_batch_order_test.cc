// Layer-major micro-batches (trainer/micro_batch_order.h) against batch-major, through the
// real engine on the host device: over random small models, micro-batch counts, budgets
// (unlimited, and the engine's minimum with states on NVMe), with and without --recompute
// and clipping, every step's loss and gradient norm and the final weights and moments are
// bit-identical; a block's parameters and gradient cross as often per step as with one
// micro-batch; and the choice of order follows the device budget, saying why.
#include "trainer/micro_batch_order.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <random>

#include "model/run_size.h"
#include "tests/trainer/same_bits.h"
#include "trainer/trainer.h"

namespace strata::trainer {
namespace {

using model::Batcher;
using model::ExpectSameBits;
using model::Gpt2BlockSpecs;
using model::Gpt2Config;
using model::SavedActivationBytes;
using model::TokenStream;

struct Case {
  Gpt2Config cfg;
  TrainOptions opt;
  bool clip = true;
  bool nvme = false;  // states on NVMe under the engine's minimum budgets
};

struct Outcome : model::RunBits {
  EdgeBytes bytes;  // summed over the steps
  MicroBatchOrder order = MicroBatchOrder::kBatchMajor;
  std::string reason;
  int activation_slots = 0;
  int activation_host_slots = 0, activation_count = 0;  // the engine's stash (PlacementReport)
  bool recompute = false;
  uint64_t engine_device_bytes = 0;
};

// A small random run: 1-3 layers, 1-2 heads, T 4-16, B 1-3, M in [min_mb, min_mb + span),
// recompute and clipping on half of them; states on NVMe on odd trials.
Case RandomCase(std::mt19937& rng, int trial, int min_mb, int span) {
  Case c;
  c.cfg.layers = 1 + int(rng() % 3);
  c.cfg.heads = 1 + int(rng() % 2);
  c.cfg.d_model = c.cfg.heads * (8 + 8 * int(rng() % 3));
  c.cfg.max_seq = 16;
  c.opt.seq_len = 4 + int(rng() % 13);
  c.opt.batch = 1 + int(rng() % 3);
  c.opt.micro_batches = min_mb + int(rng() % uint32_t(span));
  c.opt.recompute = rng() % 2 == 0;
  c.opt.lr = 3e-3;
  c.clip = rng() % 2 == 0;
  c.nvme = trial % 2 == 1;
  return c;
}

// A fixed small run: 2 heads, T 16, B 2, one micro-batch.
Case FixedCase(int layers, int d_model) {
  Case c;
  c.cfg.layers = layers;
  c.cfg.d_model = d_model;
  c.cfg.heads = 2;
  c.cfg.max_seq = 16;
  c.opt.seq_len = 16;
  c.opt.batch = 2;
  c.opt.micro_batches = 1;
  return c;
}

std::string Describe(const Case& c, int trial, const std::string& nvme) {
  return "trial " + std::to_string(trial) + " (L " + std::to_string(c.cfg.layers) + ", C " +
         std::to_string(c.cfg.d_model) + ", T " + std::to_string(c.opt.seq_len) + ", B " +
         std::to_string(c.opt.batch) + ", M " + std::to_string(c.opt.micro_batches) +
         (c.opt.recompute ? ", recompute" : "") + (c.clip ? ", clip" : "") +
         (c.nvme ? ", " + nvme : "") + ")";
}

class MicroBatchOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/var/tmp/strata-lm-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string text = model::GenerateCorpus(20000, 5);
    data_.tokens.assign(text.begin(), text.end());
    for (int32_t& t : data_.tokens) t &= 0xff;
  }
  void TearDown() override { EXPECT_EQ(0, std::system(("rm -rf " + dir_).c_str())); }

  EngineOptions Options(Device* dev, const Case& c, uint64_t device_mem, uint64_t host_mem,
                        const std::string& nvme) {
    EngineOptions eo;
    eo.device = dev;
    eo.device_mem_bytes = device_mem;
    eo.host_mem_bytes = host_mem;
    if (!nvme.empty()) eo.nvme_paths = {nvme};
    eo.beta2 = 0.95;
    eo.weight_decay = 0.1;
    eo.grad_clip = c.clip ? 0.5 : 0;
    eo.micro_batches = c.opt.micro_batches;
    return eo;
  }

  // The engine's minimum budgets for the case (batch-major, one micro-batch of gradients).
  PlacementReport Probe(const Case& c, const std::string& nvme) {
    if (!nvme.empty()) {
      EXPECT_EQ(0, std::system(("rm -rf " + nvme + " && mkdir -p " + nvme).c_str()));
    }
    auto dev = CreateHostDevice({});
    EXPECT_TRUE(dev.ok());
    EngineOptions eo = Options(dev->get(), c, 0, 64ull << 20, nvme);
    auto e = Engine::Create(Gpt2BlockSpecs(c.cfg), eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? (*e)->Placement() : PlacementReport{};
  }

  Outcome Run(const Case& c, MicroBatchOrderChoice choice, uint64_t device_mem, uint64_t host_mem,
              int steps, const std::string& tag,
              OffloadActivations offload = OffloadActivations::kOff, bool recompute_auto = false,
              std::optional<double> recompute_seconds = std::nullopt) {
    Outcome out;
    const std::string nvme = c.nvme ? dir_ + "/" + tag : "";
    if (!nvme.empty()) {
      EXPECT_EQ(0, std::system(("rm -rf " + nvme + " && mkdir -p " + nvme).c_str()));
    }
    auto dev = CreateHostDevice({});
    EXPECT_TRUE(dev.ok());
    MicroBatchOrderInputs in;
    in.choice = choice;
    in.micro_batches = c.opt.micro_batches;
    in.saved_activation_bytes =
        SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, c.opt.recompute);
    in.recompute = c.opt.recompute;
    in.recompute_auto = recompute_auto;
    in.saved_activation_bytes_recompute =
        SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, true);
    in.offload = offload;
    in.recompute_seconds = recompute_seconds;
    if (offload != OffloadActivations::kOff) {
      in.offload_shape = model::OffloadedActivations(c.cfg, c.opt.batch, c.opt.seq_len);
    }
    auto made = CreateOrderedEngine(Gpt2BlockSpecs(c.cfg),
                                    Options(dev->get(), c, device_mem, host_mem, nvme), in);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return out;
    out.order = made->order;
    out.reason = made->reason;
    TrainOptions o = c.opt;
    o.micro_batch_order = made->order;
    o.accumulate_on_device = made->accumulate_on_device;
    o.activation_slots = made->activation_slots;
    o.recompute = made->recompute;
    out.activation_slots = made->activation_slots;
    out.activation_host_slots = made->engine->Placement().activation_host_slots;
    out.activation_count = made->engine->Placement().activation_count;
    out.recompute = made->recompute;
    out.engine_device_bytes = made->engine_device_bytes;
    auto b = Batcher::Create(&data_, o.batch, o.seq_len);
    EXPECT_TRUE(b.ok());
    Trainer t(made->engine.get(), dev->get(), c.cfg, o, &*b);
    EXPECT_TRUE(t.InitWeights(nullptr, 11).ok());
    for (int s = 0; s < steps; ++s) {
      auto r = t.Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return out;
      out.losses.push_back(r->loss);
      out.norms.push_back(r->stats.grad_norm);
      out.bytes.h2d += r->stats.bytes.h2d;
      out.bytes.d2h += r->stats.bytes.d2h;
    }
    model::ReadStates(*made->engine, &out);
    return out;
  }

  std::string dir_;
  TokenStream data_;
};

TEST_F(MicroBatchOrderTest, LayerMajorIsBitIdenticalOverRandomModelsAndBudgets) {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 6; ++trial) {
    const Case c = RandomCase(rng, trial, 2, 3);
    const std::string what = Describe(c, trial, "NVMe at the minimum budgets");
    uint64_t device = 0, host = 0;
    if (c.nvme) {
      const PlacementReport p = Probe(c, dir_ + "/probe");
      const uint64_t extra =
          SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, c.opt.recompute) *
          uint64_t(c.opt.micro_batches - 1);
      device = p.device_min_bytes + extra;  // the engine gets exactly its minimum
      host = 3 * p.host_min_bytes;
    }
    const Outcome batch = Run(c, MicroBatchOrderChoice::kBatch, device, host, 3, "batch");
    const Outcome layer = Run(c, MicroBatchOrderChoice::kLayer, device, host, 3, "layer");
    ASSERT_EQ(batch.order, MicroBatchOrder::kBatchMajor) << what;
    ASSERT_EQ(layer.order, MicroBatchOrder::kLayerMajor) << what << ": " << layer.reason;
    ExpectSameBits(batch, layer, what);
    // Each block's gradient crosses once per step, as with one micro-batch.
    EXPECT_EQ(layer.bytes.d2h * uint64_t(c.opt.micro_batches), batch.bytes.d2h) << what;
  }
}

TEST_F(MicroBatchOrderTest, ParamsAndGradientsCrossAsOftenAsWithOneMicroBatch) {
  Case c = FixedCase(3, 32);
  c.opt.recompute = true;
  const PlacementReport p = Probe(c, "");
  // Room for one block at a time (the engine's minimum), plus the layer-major activations.
  const uint64_t acts = SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, true);
  const Outcome one = Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes, 0, 2, "one");
  c.opt.micro_batches = 4;
  const Outcome layer =
      Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes + 3 * acts, 0, 2, "layer");
  // Batch-major keeps no more activations: its engine gets the same minimum.
  const Outcome batch = Run(c, MicroBatchOrderChoice::kBatch, p.device_min_bytes, 0, 2, "batch");
  ASSERT_EQ(layer.order, MicroBatchOrder::kLayerMajor) << layer.reason;
  EXPECT_EQ(layer.bytes.h2d, one.bytes.h2d);
  EXPECT_EQ(layer.bytes.d2h, one.bytes.d2h);
  EXPECT_GT(batch.bytes.h2d, 2 * one.bytes.h2d);
  EXPECT_EQ(batch.bytes.d2h, 4 * one.bytes.d2h);
}

TEST_F(MicroBatchOrderTest, TheDeviceBudgetDecidesAndTheReasonSaysWhy) {
  Case c = FixedCase(2, 32);
  c.opt.micro_batches = 3;
  const PlacementReport p = Probe(c, "");
  const uint64_t acts = SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, false);
  auto dev = CreateHostDevice({});
  ASSERT_TRUE(dev.ok());
  MicroBatchOrderInputs in;
  in.micro_batches = 3;
  in.saved_activation_bytes = acts;
  auto make = [&](uint64_t device_mem) {
    return CreateOrderedEngine(Gpt2BlockSpecs(c.cfg), Options(dev->get(), c, device_mem, 0, ""),
                               in);
  };
  // Room for the engine and two more micro-batches' activations: layer-major, the engine
  // gets the rest.
  auto fits = make(p.device_min_bytes + 2 * acts);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(fits->order, MicroBatchOrder::kLayerMajor);
  EXPECT_TRUE(fits->accumulate_on_device);
  EXPECT_EQ(fits->engine_device_bytes, p.device_min_bytes);
  EXPECT_EQ(fits->activation_bytes, 2 * acts);
  EXPECT_EQ(fits->engine->Placement().device_budget_bytes, p.device_min_bytes);
  // One byte short: auto runs batch-major with the whole budget and says why.
  auto short_by_one = make(p.device_min_bytes + 2 * acts - 1);
  ASSERT_TRUE(short_by_one.ok()) << short_by_one.status().ToString();
  EXPECT_EQ(short_by_one->order, MicroBatchOrder::kBatchMajor);
  EXPECT_NE(short_by_one->reason.find("layer-major does not fit"), std::string::npos)
      << short_by_one->reason;
  EXPECT_NE(short_by_one->reason.find("activations of 2 more micro-batches"), std::string::npos)
      << short_by_one->reason;
  // Forced, the same budget is refused with what to change.
  in.choice = MicroBatchOrderChoice::kLayer;
  auto forced = make(p.device_min_bytes + 2 * acts - 1);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(forced.status().message().find("--device-mem"), std::string::npos)
      << forced.status().ToString();
  EXPECT_NE(forced.status().message().find("--micro-batch-order batch"), std::string::npos);
  // Unlimited: layer-major, unless the device has less room than the activations need.
  EXPECT_EQ(make(0)->order, MicroBatchOrder::kLayerMajor);
  in.unlimited_room_bytes = 2 * acts - 1;
  EXPECT_EQ(make(0).status().code(), StatusCode::kOutOfMemory);  // forced
  in.choice = MicroBatchOrderChoice::kAuto;
  auto no_room = make(0);
  ASSERT_TRUE(no_room.ok());
  EXPECT_EQ(no_room->order, MicroBatchOrder::kBatchMajor);
  EXPECT_NE(no_room->reason.find("the device has left"), std::string::npos) << no_room->reason;
  in.unlimited_room_bytes = 2 * acts;
  EXPECT_EQ(make(0)->order, MicroBatchOrder::kLayerMajor);
  in.unlimited_room_bytes = 0;
  // Forced batch: batch-major; one micro-batch: nothing to order.
  in.choice = MicroBatchOrderChoice::kBatch;
  EXPECT_EQ(make(0)->order, MicroBatchOrder::kBatchMajor);
  in.choice = MicroBatchOrderChoice::kAuto;
  in.micro_batches = 1;
  EngineOptions one = Options(dev->get(), c, 0, 0, "");
  one.micro_batches = 1;
  auto single = CreateOrderedEngine(Gpt2BlockSpecs(c.cfg), one, in);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->order, MicroBatchOrder::kBatchMajor);
}

// Offloaded activations: micro-batches that share one activation slot, their block inputs in
// the engine (pinned host, and NVMe where the host budget is short), give the same bits as
// batch-major with every activation on the device, over random models and 2..8
// micro-batches, at the engine's device minimum.
TEST_F(MicroBatchOrderTest, OffloadedActivationsAreBitIdenticalOverRandomModelsAndBudgets) {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 6; ++trial) {
    Case c = RandomCase(rng, trial, 2, 7);
    c.opt.recompute = true;  // offloading needs it
    const std::string what = Describe(c, trial, "NVMe at tight budgets");
    const PlacementReport p = Probe(c, c.nvme ? dir_ + "/probe" : "");
    const auto shape = model::OffloadedActivations(c.cfg, c.opt.batch, c.opt.seq_len);
    // With NVMe: room for a few activations in host memory beside the states' minimum; the
    // rest go to NVMe.
    const uint64_t key = (shape.key_bytes + 4095) / 4096 * 4096;
    const uint64_t host = c.nvme ? p.host_min_bytes + 4 * key : 0;
    const Outcome batch = Run(c, MicroBatchOrderChoice::kBatch, 0, host, 3, "batch");
    const Outcome layer = Run(c, MicroBatchOrderChoice::kLayer, p.device_min_bytes, host, 3,
                              "layer", OffloadActivations::kOn);
    ASSERT_EQ(layer.order, MicroBatchOrder::kLayerMajor) << what << ": " << layer.reason;
    EXPECT_EQ(layer.activation_slots, 1) << what << ": " << layer.reason;
    EXPECT_NE(layer.reason.find("offloaded"), std::string::npos) << layer.reason;
    ExpectSameBits(batch, layer, what);
  }
}

// The mixed placement (issue 45, round 4): micro-batches 0..S-2 keep their activations on the
// device (room for 1..M-2 more slots beside the engine's minimum), the others share slot S-1
// with their block inputs in a few pinned host slots and the rest on NVMe. Same bits as
// batch-major with every activation on the device, over random models; every trial spills.
TEST_F(MicroBatchOrderTest, MixedDeviceAndNvmeActivationsAreBitIdenticalOverRandomModels) {
  std::mt19937 rng(20261206);
  for (int trial = 0; trial < 4; ++trial) {
    Case c = RandomCase(rng, trial, 3, 4);
    c.opt.recompute = true;
    c.nvme = true;
    const std::string what = Describe(c, trial, "mixed device and NVMe activations");
    const PlacementReport p = Probe(c, dir_ + "/probe");
    const auto shape = model::OffloadedActivations(c.cfg, c.opt.batch, c.opt.seq_len);
    const uint64_t key = (shape.key_bytes + 4095) / 4096 * 4096;
    const uint64_t per = SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, true);
    const int device_slots = 1 + int(rng() % uint32_t(c.opt.micro_batches - 2));
    const uint64_t device = p.device_min_bytes + per * uint64_t(device_slots);
    const uint64_t host = p.host_min_bytes + 4 * key;
    const Outcome batch = Run(c, MicroBatchOrderChoice::kBatch, 0, host, 2, "batch");
    const Outcome layer =
        Run(c, MicroBatchOrderChoice::kLayer, device, host, 2, "layer", OffloadActivations::kOn);
    ASSERT_EQ(layer.order, MicroBatchOrder::kLayerMajor) << what << ": " << layer.reason;
    EXPECT_GT(layer.activation_slots, 1) << what << ": " << layer.reason;
    EXPECT_LT(layer.activation_host_slots, layer.activation_count)
        << what << ": no activation went to NVMe";
    ExpectSameBits(batch, layer, what);
  }
}

TEST_F(MicroBatchOrderTest, AutoOffloadsWhenTheDeviceHasNoRoomAndSaysWhy) {
  Case c = FixedCase(3, 64);
  const PlacementReport p = Probe(c, "");
  const Outcome one = Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes, 0, 2, "one");
  // No room beside the engine's minimum: auto turns recompute on and offloads.
  c.opt.micro_batches = 4;
  const Outcome layer = Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes, 0, 2, "layer",
                            OffloadActivations::kAuto, /*recompute_auto=*/true);
  ASSERT_EQ(layer.order, MicroBatchOrder::kLayerMajor) << layer.reason;
  EXPECT_TRUE(layer.recompute);
  EXPECT_EQ(layer.activation_slots, 1);
  EXPECT_EQ(layer.engine_device_bytes, p.device_min_bytes);  // the one-micro-batch minimum
  EXPECT_NE(layer.reason.find("offloaded"), std::string::npos) << layer.reason;
  EXPECT_NE(layer.reason.find("--recompute turned on"), std::string::npos) << layer.reason;
  // Off: batch-major, naming what did not fit.
  const Outcome batch = Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes, 0, 2, "batch",
                            OffloadActivations::kOff, /*recompute_auto=*/true);
  ASSERT_EQ(batch.order, MicroBatchOrder::kBatchMajor);
  EXPECT_NE(batch.reason.find("layer-major does not fit"), std::string::npos) << batch.reason;
  ExpectSameBits(batch, layer, "auto offload vs batch-major");
  // The weights crossed once per pass: the offloaded run's host-to-device bytes are the
  // one-micro-batch run's plus the activations coming back, below batch-major's.
  const auto shape = model::OffloadedActivations(c.cfg, c.opt.batch, c.opt.seq_len);
  EXPECT_EQ(layer.bytes.h2d, one.bytes.h2d + 2 * 4 * shape.h2d_bytes_per_micro_batch);
  EXPECT_LT(layer.bytes.h2d, batch.bytes.h2d);
  // Room for the recomputed activations of three more: on the device, recompute turned on.
  const uint64_t acts = SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, true);
  const Outcome fits = Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes + 3 * acts, 0, 2,
                           "fits", OffloadActivations::kAuto, /*recompute_auto=*/true);
  ASSERT_EQ(fits.order, MicroBatchOrder::kLayerMajor) << fits.reason;
  EXPECT_EQ(fits.activation_slots, 0);
  EXPECT_TRUE(fits.recompute);
  EXPECT_NE(fits.reason.find("--recompute turned on to fit them"), std::string::npos)
      << fits.reason;
  // Sixteen micro-batches fit the one-micro-batch device minimum.
  c.opt.micro_batches = 16;
  const Outcome many = Run(c, MicroBatchOrderChoice::kAuto, p.device_min_bytes, 0, 1, "many",
                           OffloadActivations::kAuto, /*recompute_auto=*/true);
  ASSERT_EQ(many.order, MicroBatchOrder::kLayerMajor) << many.reason;
  EXPECT_EQ(many.engine_device_bytes, p.device_min_bytes);
}

// Where layer-major needs --recompute turned on, auto weighs the recompute's predicted time
// against the time batch-major's extra weight and gradient bytes take: a recompute that costs
// more picks batch-major and says why; one that costs less (or an unknown cost) keeps the
// byte rule. A --recompute the user gave, or a forced order, is not weighed.
TEST_F(MicroBatchOrderTest, AutoWeighsTheRecomputeAgainstBatchMajorsTraffic) {
  Case c = FixedCase(3, 64);
  const PlacementReport p = Probe(c, "");
  c.opt.micro_batches = 4;
  const uint64_t acts = SavedActivationBytes(c.cfg, c.opt.batch, c.opt.seq_len, true);
  const auto run = [&](MicroBatchOrderChoice choice, uint64_t device, double seconds,
                       const std::string& tag) {
    return Run(c, choice, device, 0, 2, tag, OffloadActivations::kAuto,
               /*recompute_auto=*/!c.opt.recompute, seconds);
  };
  // An hour of recompute: batch-major, offloaded (no room) or on the device (room for three
  // more micro-batches' recomputed activations), saying what was weighed.
  for (const uint64_t device : {p.device_min_bytes, p.device_min_bytes + 3 * acts}) {
    SCOPED_TRACE("--device-mem " + std::to_string(device));
    const Outcome slow = run(MicroBatchOrderChoice::kAuto, device, 3600, "slow");
    ASSERT_EQ(slow.order, MicroBatchOrder::kBatchMajor) << slow.reason;
    EXPECT_FALSE(slow.recompute);
    EXPECT_NE(slow.reason.find("batch-major: layer-major needs --recompute, whose extra forward "
                               "(3.6e+03 s a step"),
              std::string::npos)
        << slow.reason;
    EXPECT_NE(slow.reason.find("take longer than batch-major's"), std::string::npos) << slow.reason;
    // A free recompute: layer-major with it turned on, as the byte rule alone chooses.
    const Outcome fast = run(MicroBatchOrderChoice::kAuto, device, 0, "fast");
    ASSERT_EQ(fast.order, MicroBatchOrder::kLayerMajor) << fast.reason;
    EXPECT_TRUE(fast.recompute);
    EXPECT_NE(fast.reason.find("--recompute turned on"), std::string::npos) << fast.reason;
    ExpectSameBits(slow, fast, "batch-major vs layer-major with recompute");
    // Forced layer-major is not weighed.
    const Outcome forced = run(MicroBatchOrderChoice::kLayer, device, 3600, "forced");
    EXPECT_EQ(forced.order, MicroBatchOrder::kLayerMajor) << forced.reason;
  }
  // --recompute given: both orders pay for it, so bytes decide.
  c.opt.recompute = true;
  const Outcome given = run(MicroBatchOrderChoice::kAuto, p.device_min_bytes, 3600, "given");
  EXPECT_EQ(given.order, MicroBatchOrder::kLayerMajor) << given.reason;
}

TEST(MicroBatchOrderParse, RecomputeSecondsCountEveryBlockButTheLastPerMicroBatch) {
  EXPECT_DOUBLE_EQ(RecomputeSeconds(0.5, 6, 4), 0.5 * 5 * 4);
  EXPECT_DOUBLE_EQ(RecomputeSeconds(0.5, 1, 4), 0.0);
}

TEST(MicroBatchOrderParse, OffloadActivationsNamesTheFlag) {
  EXPECT_EQ(*ParseOffloadActivations("on"), OffloadActivations::kOn);
  EXPECT_EQ(*ParseOffloadActivations("off"), OffloadActivations::kOff);
  EXPECT_EQ(*ParseOffloadActivations("auto"), OffloadActivations::kAuto);
  auto bad = ParseOffloadActivations("yes");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--offload-activations yes"), std::string::npos);
}

// What the host device leaves for layer-major's activations without a --device-mem cap.
TEST(MicroBatchOrderRoom, HostRoomLeftIsMemoryLessActivationsAndStates) {
  model::RunSize size;
  size.activation_bytes = 10;
  size.state_bytes = 100;
  EXPECT_EQ(model::HostRoomLeft(size, {.host_memory_bytes = 1000, .have_nvme = true}), 990u);
  EXPECT_EQ(model::HostRoomLeft(size, {.host_memory_bytes = 1000, .have_nvme = false}), 890u);
  EXPECT_EQ(
      model::HostRoomLeft(size, {.host_memory_bytes = 1000, .cpu_model = false, .have_nvme = true}),
      1000u);
  EXPECT_EQ(model::HostRoomLeft(size, {.host_memory_bytes = 50, .have_nvme = false}), 1u);
  EXPECT_EQ(model::HostRoomLeft(size, {.host_memory_bytes = 0}), 0u);  // not known
}

TEST(MicroBatchOrderParse, NamesTheFlag) {
  EXPECT_EQ(*ParseMicroBatchOrder("layer"), MicroBatchOrderChoice::kLayer);
  EXPECT_EQ(*ParseMicroBatchOrder("batch"), MicroBatchOrderChoice::kBatch);
  EXPECT_EQ(*ParseMicroBatchOrder("auto"), MicroBatchOrderChoice::kAuto);
  auto bad = ParseMicroBatchOrder("layers");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--micro-batch-order layers"), std::string::npos);
}

}  // namespace
}  // namespace strata::trainer
