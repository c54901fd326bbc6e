// GPT-2 through the engine on a CUDA device (bf16 kernels of model/cuda/): the loss follows
// the CPU (fp32) run within bf16 rounding, and an offloaded CUDA run (tiny device and host
// budgets, states on NVMe) gives the GPU-resident run's losses bit for bit, and so does a run
// whose engine all-gathers and reduce-scatters through a one-rank NCCL communicator in device
// memory (the multi-GPU path, on one GPU), and so do layer-major micro-batches, with every
// micro-batch in its own activation slot or sharing one with their activations in the engine.
// Skipped where no GPU is present; compiled everywhere.
#include <gtest/gtest.h>
#include <unistd.h>

#include "strata/comm.h"
#include "tests/trainer/same_bits.h"
#include "trainer/micro_batch_order.h"
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

class TrainCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
    char tmpl[] = "/var/tmp/strata-cuda-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cfg_.layers = 2;
    cfg_.d_model = 64;
    cfg_.heads = 2;
    cfg_.max_seq = 32;
    opt_.seq_len = 32;
    opt_.batch = 4;
    opt_.micro_batches = 2;
    opt_.lr = 1e-3;
    opt_.steps = 4;
    const std::string text = GenerateCorpus(60000, 5);
    for (unsigned char c : text) data_.tokens.push_back(c);
    auto b = Batcher::Create(&data_, opt_.batch, opt_.seq_len);
    ASSERT_TRUE(b.ok());
    batcher_ = std::make_unique<Batcher>(*b);
  }
  void TearDown() override {
    if (!dir_.empty()) {
      EXPECT_EQ(0, std::system(("rm -rf " + dir_).c_str()));
    }
  }

  std::vector<double> Run(bool cuda, uint64_t device_mem, uint64_t host_mem,
                          const std::string& nvme, bool nccl = false) {
    std::vector<double> losses;
    auto dev = cuda ? CreateCudaDevice({}) : CreateHostDevice({});
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (!dev.ok()) return losses;
    EngineOptions eo;
    eo.device = dev->get();
    std::unique_ptr<Communicator> gloo, device_comm;
    if (nccl) {
      CommOptions co;
      co.rendezvous.path = dir_ + "/rendezvous" + std::to_string(rendezvous_++);  // fresh
      EXPECT_EQ(0, std::system(("mkdir -p " + co.rendezvous.path).c_str()));
      co.timeout = std::chrono::seconds(60);
      auto g = CreateGlooCommunicator(co);
      EXPECT_TRUE(g.ok()) << g.status().ToString();
      if (!g.ok()) return losses;
      gloo = std::move(g).value();
      co.store_prefix = "nccl";
      auto n = CreateNcclCommunicator(co, gloo->store(), **dev);
      EXPECT_TRUE(n.ok()) << n.status().ToString();
      if (!n.ok()) return losses;
      device_comm = std::move(n).value();
      eo.comm = device_comm.get();
      eo.host_comm = gloo.get();
    }
    eo.device_mem_bytes = device_mem;
    eo.host_mem_bytes = host_mem;
    if (!nvme.empty()) eo.nvme_paths = {nvme};
    eo.beta2 = 0.95;
    eo.weight_decay = 0.1;
    eo.grad_clip = 1.0;
    eo.micro_batches = opt_.micro_batches;
    auto e = Engine::Create(Gpt2BlockSpecs(cfg_), eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return losses;
    if (nccl) {
      EXPECT_EQ((*e)->Placement().collective_memory, CollectiveMemory::kDevice);
    }
    Trainer t(e->get(), dev->get(), cfg_, opt_, batcher_.get());
    EXPECT_TRUE(t.InitWeights(nullptr, 3).ok());
    for (int s = 0; s < opt_.steps; ++s) {
      auto r = t.Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) break;
      losses.push_back(r->loss);
      // The model's kernels, timed with CUDA events: some time, and less than the step's.
      if (cuda) {
        EXPECT_GT(r->compute_seconds, 0.0);
        EXPECT_LT(r->compute_seconds, r->stats.seconds);
      }
    }
    return losses;
  }

  // A run in the micro-batch order `in` chooses (trainer/micro_batch_order.h), as `strata
  // train` makes it: losses, gradient norms and every block's states after the steps.
  struct Outcome : RunBits {
    MicroBatchOrder order = MicroBatchOrder::kBatchMajor;
    int activation_slots = 0;
  };
  Outcome RunOrdered(trainer::MicroBatchOrderInputs in, uint64_t host_mem,
                     const std::string& nvme) {
    Outcome out;
    auto dev = CreateCudaDevice({});
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (!dev.ok()) return out;
    EngineOptions eo;
    eo.device = dev->get();
    eo.host_mem_bytes = host_mem;
    if (!nvme.empty()) eo.nvme_paths = {nvme};
    eo.grad_clip = 1.0;
    eo.micro_batches = opt_.micro_batches;
    in.micro_batches = opt_.micro_batches;
    in.recompute = opt_.recompute;
    in.offload_shape =
        OffloadedActivations(cfg_, opt_.batch, opt_.seq_len, ResidualValueBytes(DeviceKind::kCuda));
    auto made = trainer::CreateOrderedEngine(Gpt2BlockSpecs(cfg_), eo, in);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return out;
    TrainOptions o = opt_;
    o.micro_batch_order = out.order = made->order;
    o.accumulate_on_device = made->accumulate_on_device;
    o.activation_slots = out.activation_slots = made->activation_slots;
    o.recompute = made->recompute;
    Trainer t(made->engine.get(), dev->get(), cfg_, o, batcher_.get());
    EXPECT_TRUE(t.InitWeights(nullptr, 3).ok());
    for (int s = 0; s < opt_.steps; ++s) {
      auto r = t.Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return out;
      out.losses.push_back(r->loss);
      out.norms.push_back(r->stats.grad_norm);
    }
    ReadStates(*made->engine, &out);
    return out;
  }

  Gpt2Config cfg_;
  TrainOptions opt_;
  TokenStream data_;
  std::unique_ptr<Batcher> batcher_;
  std::string dir_;
  int rendezvous_ = 0;
};

TEST_F(TrainCudaTest, FollowsTheCpuRunAndOffloadingChangesNoBit) {
  const std::vector<double> cpu = Run(false, 0, 0, "");
  const std::vector<double> gpu = Run(true, 0, 0, "");
  ASSERT_EQ(cpu.size(), 4u);
  ASSERT_EQ(gpu.size(), 4u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 0.02 * cpu[i]) << "step " << i + 1;  // bf16 vs fp32
  }
  const std::string nvme = dir_ + "/nvme";
  ASSERT_EQ(0, std::system(("mkdir -p " + nvme).c_str()));
  uint64_t device_min = 0, host_min = 0;  // the planner's minimums with NVMe
  {
    auto dev = CreateCudaDevice({});
    ASSERT_TRUE(dev.ok());
    EngineOptions eo;
    eo.device = dev->get();
    eo.host_mem_bytes = 64 << 20;
    eo.nvme_paths = {nvme};
    eo.micro_batches = opt_.micro_batches;
    auto e = Engine::Create(Gpt2BlockSpecs(cfg_), eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    device_min = (*e)->Placement().device_min_bytes;
    host_min = (*e)->Placement().host_min_bytes;
  }
  ASSERT_EQ(0, std::system(("rm -rf " + nvme + " && mkdir -p " + nvme).c_str()));
  const std::vector<double> off = Run(true, device_min, 2 * host_min, nvme);
  EXPECT_EQ(off, gpu);
}

// The engine's collectives on NCCL (device memory, Lane::kComm stream, ordered by events after
// the shard copies and before compute): with one rank they move nothing, so every loss must
// equal the run without a communicator, bit for bit; a missing or misplaced event shows as
// a stale block or gradient.
TEST_F(TrainCudaTest, OneRankNcclCollectivesChangeNoBit) {
  const std::vector<double> plain = Run(true, 0, 0, "");
  const std::vector<double> nccl = Run(true, 0, 0, "", /*nccl=*/true);
  ASSERT_EQ(plain.size(), 4u);
  EXPECT_EQ(nccl, plain);
  // At the device minimum every block is copied and gathered again in backward.
  uint64_t device_min = 0;
  {
    auto dev = CreateCudaDevice({});
    ASSERT_TRUE(dev.ok());
    EngineOptions eo;
    eo.device = dev->get();
    eo.micro_batches = opt_.micro_batches;
    auto e = Engine::Create(Gpt2BlockSpecs(cfg_), eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    device_min = (*e)->Placement().device_min_bytes;
  }
  EXPECT_EQ(Run(true, device_min, 0, "", /*nccl=*/true), plain);
}

// Layer-major micro-batches on the CUDA model: each in its own activation slot (the model
// sums their gradients into the engine's buffer, AccumulateF32), or sharing one slot with
// their residual stream, gradient and head gradient in the engine's pinned host slots (the
// NVMe spill is the engine's, tested on the CPU in micro_batch_order_test), with and without
// recompute where it applies. Every loss, norm and state equals
// batch-major's bit for bit: the same kernels on the same values, the gradients summed in the
// engine's order.
TEST_F(TrainCudaTest, LayerMajorAndOffloadedActivationsEqualBatchMajorBitForBit) {
  opt_.micro_batches = 4;
  opt_.batch = 2;
  auto b = Batcher::Create(&data_, opt_.batch, opt_.seq_len);
  ASSERT_TRUE(b.ok());
  batcher_ = std::make_unique<Batcher>(*b);
  for (bool recompute : {false, true}) {
    opt_.recompute = recompute;
    const std::string tag = recompute ? " (recompute)" : "";
    trainer::MicroBatchOrderInputs in;
    in.choice = trainer::MicroBatchOrderChoice::kBatch;
    in.offload = trainer::OffloadActivations::kOff;
    const Outcome batch = RunOrdered(in, 0, "");
    ASSERT_EQ(batch.losses.size(), 4u);
    in.choice = trainer::MicroBatchOrderChoice::kLayer;
    const Outcome layer = RunOrdered(in, 0, "");
    EXPECT_EQ(layer.order, MicroBatchOrder::kLayerMajor);
    ExpectSameBits(layer, batch, "layer-major, a slot per micro-batch" + tag);
    if (!recompute) continue;  // shared slots move block inputs only: they need recompute
    in.offload = trainer::OffloadActivations::kOn;
    const Outcome shared = RunOrdered(in, 0, "");
    EXPECT_EQ(shared.order, MicroBatchOrder::kLayerMajor);
    EXPECT_EQ(shared.activation_slots, 1);
    ExpectSameBits(shared, batch, "layer-major, one shared slot" + tag);
  }
}

}  // namespace
}  // namespace strata::model
