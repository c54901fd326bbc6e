// GPT-2 through the real engine: an offloaded run (smallest budgets the planner accepts,
// states on NVMe) gives the in-memory run's loss at every step bit for bit and
// byte-identical saved weights; a run stopped after step k and resumed from the swap store
// reproduces the uninterrupted run's steps k+1..n.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "trainer/trainer.h"

namespace strata::model {
namespace {

using trainer::ForwardBackwardEngine;
using trainer::LearningRate;
using trainer::LrSchedule;
using trainer::ReadWeights;
using trainer::StepResult;
using trainer::Trainer;
using trainer::TrainOptions;

struct RunConfig {
  uint64_t device_mem = 0, host_mem = 0;
  std::string nvme;
  bool resume = false;
  bool recompute = false;
  bool durable = false;
};

class TrainEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/var/tmp/strata-train-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cfg_.layers = 2;
    cfg_.d_model = 32;
    cfg_.heads = 2;
    cfg_.max_seq = 16;
    opt_.seq_len = 16;
    opt_.batch = 2;
    opt_.micro_batches = 2;
    opt_.lr = 3e-3;
    opt_.warmup = 2;
    opt_.steps = 5;
    opt_.schedule = LrSchedule::kCosine;
    data_.tokens.assign(20000, 0);
    const std::string text = GenerateCorpus(20000, 3);
    for (size_t i = 0; i < text.size(); ++i) data_.tokens[i] = static_cast<unsigned char>(text[i]);
    auto b = Batcher::Create(&data_, opt_.batch, opt_.seq_len);
    ASSERT_TRUE(b.ok());
    batcher_ = std::make_unique<Batcher>(*b);
  }
  void TearDown() override { EXPECT_EQ(0, std::system(("rm -rf " + dir_).c_str())); }

  EngineOptions Options(Device* d, const RunConfig& rc) {
    EngineOptions eo;
    eo.device = d;
    eo.device_mem_bytes = rc.device_mem;
    eo.host_mem_bytes = rc.host_mem;
    if (!rc.nvme.empty()) eo.nvme_paths = {rc.nvme};
    eo.beta1 = 0.9;
    eo.beta2 = 0.95;
    eo.weight_decay = 0.1;
    eo.grad_clip = 1.0;
    eo.micro_batches = opt_.micro_batches;
    eo.resume = rc.resume;
    eo.durable = rc.durable;
    return eo;
  }

  // Runs steps up to `last` (from the engine's resumed step); returns the losses and
  // writes the final weights to `save`.
  std::vector<double> Run(const RunConfig& rc, int64_t last, const std::string& save,
                          PlacementReport* placement = nullptr) {
    std::vector<double> losses;
    auto dev = CreateHostDevice({});
    EXPECT_TRUE(dev.ok());
    TrainOptions o = opt_;
    o.recompute = rc.recompute;
    auto e = Engine::Create(Gpt2BlockSpecs(cfg_), Options(dev->get(), rc));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return losses;
    if (placement) *placement = (*e)->Placement();
    Trainer t(e->get(), dev->get(), cfg_, o, batcher_.get());
    if ((*e)->ResumedStep() == 0) {
      EXPECT_TRUE(t.InitWeights(nullptr, 7).ok());
    }
    while (t.next_step() <= last) {
      auto r = t.Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) break;
      losses.push_back(r->loss);
    }
    if (!save.empty()) {
      auto w = t.Weights();
      EXPECT_TRUE(w.ok()) << w.status().ToString();
      if (w.ok()) {
        EXPECT_TRUE(SaveWeights(save, t.specs(), *w).ok());
      }
    }
    return losses;
  }

  // The smallest budgets the planner accepts with the states on NVMe in `nvme` (host: twice
  // the minimum, since the minimum itself leaves no room for the pinned pool's
  // fragmentation; still a small fraction of the states).
  RunConfig Tiny(const std::string& nvme) {
    PlacementReport probe;
    {
      auto dev = CreateHostDevice({});
      EXPECT_TRUE(dev.ok());
      RunConfig rc;
      rc.nvme = nvme;
      rc.host_mem = 64ull << 20;
      auto e = Engine::Create(Gpt2BlockSpecs(cfg_), Options(dev->get(), rc));
      EXPECT_TRUE(e.ok()) << e.status().ToString();
      if (e.ok()) probe = (*e)->Placement();
    }
    EXPECT_EQ(0, std::system(("rm -rf " + nvme + " && mkdir -p " + nvme).c_str()));
    RunConfig tiny;
    tiny.nvme = nvme;
    tiny.device_mem = probe.device_min_bytes;
    tiny.host_mem = 2 * probe.host_min_bytes;
    return tiny;
  }

  std::string Read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }

  Gpt2Config cfg_;
  TrainOptions opt_;
  TokenStream data_;
  std::unique_ptr<Batcher> batcher_;
  std::string dir_;
};

TEST_F(TrainEngineTest, OffloadedRunEqualsInMemoryRunBitForBit) {
  const std::vector<double> mem = Run({}, 5, dir_ + "/mem.safetensors");
  ASSERT_EQ(mem.size(), 5u);
  EXPECT_LT(mem.back(), mem.front());

  const std::string nvme = dir_ + "/nvme";
  ASSERT_EQ(0, std::system(("mkdir -p " + nvme).c_str()));
  const RunConfig tiny = Tiny(nvme);
  PlacementReport placed;
  const std::vector<double> off = Run(tiny, 5, dir_ + "/off.safetensors", &placed);
  ASSERT_EQ(off.size(), 5u);
  EXPECT_GT(placed.nvme_bytes, 0u) << placed.ToString();
  for (size_t i = 0; i < mem.size(); ++i) {
    EXPECT_EQ(mem[i], off[i]) << "step " << i + 1;
  }
  EXPECT_EQ(Read(dir_ + "/mem.safetensors"), Read(dir_ + "/off.safetensors"));

  // Activation checkpointing does not change a bit either.
  const std::vector<double> re = [&] {
    RunConfig rc;
    rc.recompute = true;
    return Run(rc, 5, dir_ + "/re.safetensors");
  }();
  EXPECT_EQ(re, mem);
  EXPECT_EQ(Read(dir_ + "/mem.safetensors"), Read(dir_ + "/re.safetensors"));
}

TEST_F(TrainEngineTest, ResumeReproducesTheUninterruptedRun) {
  const std::string a = dir_ + "/a", b = dir_ + "/b";
  ASSERT_EQ(0, std::system(("mkdir -p " + a + " " + b).c_str()));
  RunConfig full = Tiny(a);
  full.durable = true;  // every commit complete on NVMe, so any step can be resumed
  const std::vector<double> straight = Run(full, 5, dir_ + "/straight.safetensors");
  ASSERT_EQ(straight.size(), 5u);

  RunConfig first = full;
  first.nvme = b;
  const std::vector<double> head = Run(first, 2, "");  // stops after step 2
  ASSERT_EQ(head.size(), 2u);
  RunConfig again = first;
  again.resume = true;
  const std::vector<double> tail = Run(again, 5, dir_ + "/resumed.safetensors");
  ASSERT_EQ(tail.size(), 3u);
  EXPECT_EQ(head[0], straight[0]);
  EXPECT_EQ(head[1], straight[1]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tail[i], straight[2 + i]) << "step " << 3 + i;
  EXPECT_EQ(Read(dir_ + "/straight.safetensors"), Read(dir_ + "/resumed.safetensors"));
}

}  // namespace
}  // namespace strata::model
