// Multi-rank engine tests: N forked ranks, each with its own HostDevice, Gloo communicator,
// host budget and NVMe folder, train a deterministic fake model through the engine with
// ZeRO-3 sharding; the parent compares each rank's shards with a single-rank run.
//
// The fake model's backward writes grad[k] = f(param[k], k, step, micro-batch) on every rank
// (the same function of the gathered params), so the averaged gradient equals the
// single-rank one exactly and, without clipping, every rank's shard of the final states
// must equal the matching slice of the single-rank states bit for bit (a summed instead of
// averaged reduce-scatter, a wrong shard offset or a stale gather all break that). With
// clipping the norm is combined in a different order (per rank, then across ranks), so
// states are compared with a tolerance.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/log.h"
#include "strata/optim.h"
#include "tests/engine/fake_model.h"
#include "tests/forked_children.h"
#include "tests/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A fresh folder under /var/tmp, removed at the end.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("strata_engine_mr_test") {}
};

using testing::InitValue;
using testing::Param;

// Odd sizes, so shard boundaries cut through tensors and padding, and a block whose
// shards beyond rank 0 hold padding only.
// >= 0: Model() returns a random model drawn from this seed (inherited by forked ranks).
int64_t g_model_seed = -1;

std::vector<BlockSpec> Model() {
  std::vector<BlockSpec> specs;
  if (g_model_seed >= 0) {
    static const int64_t kOdd[] = {1, 15, 17, 1023, 64, 4096, 3000};
    std::mt19937_64 rng(static_cast<uint64_t>(g_model_seed));
    const int blocks = 2 + int(rng() % 4);
    for (int b = 0; b < blocks; ++b) {
      BlockSpec s;
      s.name = std::string("h.").append(std::to_string(b));
      const int tensors = 1 + int(rng() % 3);
      for (int t = 0; t < tensors; ++t) {
        s.tensors.push_back(TensorSpec{std::string("w").append(std::to_string(t)),
                                       {kOdd[rng() % 7], 1 + int64_t(rng() % 5)},
                                       (rng() % 2) == 0});
      }
      specs.push_back(s);
    }
    return specs;
  }
  const int64_t sizes[][2] = {{17, 3}, {1023, 1}, {15, 9}, {64, 5}, {3000, 1}, {1, 1}};
  for (int b = 0; b < 4; ++b) {
    BlockSpec s;
    s.name = std::string("h.").append(std::to_string(b));
    for (int t = 0; t < 2; ++t) {
      TensorSpec ts;
      ts.name = std::string("w").append(std::to_string(t));
      const auto& sz = sizes[(b * 2 + t) % 6];
      ts.shape = {sz[0], sz[1]};
      ts.weight_decay = t == 0;
      s.tensors.push_back(ts);
    }
    specs.push_back(s);
  }
  // One element: every rank but 0 holds only padding of this block.
  specs.push_back(BlockSpec{"tiny", {TensorSpec{"b", {1}, false}}});
  return specs;
}

struct RunConfig {
  int micro_batches = 1;
  double grad_clip = 0;
  bool tight = false;  // NVMe + host and device budgets at the planner's minimum
  WorkingDtype dtype = WorkingDtype::kFp32;
  int steps = 3;
  // Where the collectives run. On a HostDevice both work (auto picks device memory).
  CollectiveMemory memory = CollectiveMemory::kAuto;
  bool one_rank_comm = false;  // RunRanks(1, ...): a communicator of one rank
  Speculation speculation = Speculation::kAuto;
  bool pipeline = true;     // EngineOptions::pipeline_updates
  uint64_t host_extra = 0;  // tight: added to the host minimum (room to pipeline the updates)
  GradDtype grad_dtype = GradDtype::kFp32;        // EngineOptions::grad_dtype
  StateFormat state_format = StateFormat::kFp32;  // EngineOptions::state_format
  // The fake model's gradient: each rank's own (testing::RankGrad; rank 0 without a
  // communicator), rounded to bf16 by the model, or the average of the ranks' bf16-rounded
  // ones (see testing::FakeGradWrite).
  bool rank_grads = false;
  bool model_rounds_bf16 = false;
  int average_bf16_of_ranks = 0;
};

// What one run produces: per block, master/m/v over the full block (padded_numel of the
// single-rank layout; for a rank, only its shard's elements are set) and the step norms.
struct Outcome {
  std::vector<std::vector<float>> states;  // [block*3 + component][full-block element]
  std::vector<double> norms;
  std::vector<std::vector<float>> params;  // ReadParams of every tensor
  uint64_t h2d = 0, d2h = 0;               // bytes copied over all steps
  uint64_t redone_blocks = 0;              // speculative updates redone over all steps
  uint64_t deferred_blocks = 0;            // updates run under the next step, over all steps
};

EngineOptions BaseOptions(Device* device, const RunConfig& rc) {
  EngineOptions opt;
  opt.device = device;
  opt.micro_batches = rc.micro_batches;
  opt.grad_clip = rc.grad_clip;
  opt.weight_decay = 0.1;
  opt.dtype = rc.dtype;
  opt.nvme_stripe_bytes = 64 << 10;
  opt.collective_memory = rc.memory;
  opt.speculation = rc.speculation;
  opt.pipeline_updates = rc.pipeline;
  opt.grad_dtype = rc.grad_dtype;
  opt.state_format = rc.state_format;
  return opt;
}

// Runs the fake model on `comm` (nullptr: one rank). `dir` holds this rank's NVMe folders.
Result<Outcome> Run(const RunConfig& rc, Communicator* comm, const std::string& dir) {
  Outcome out;
  DeviceOptions dopt;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateHostDevice(dopt));
  EngineOptions opt = BaseOptions(device.get(), rc);
  opt.comm = comm;
  if (rc.tight) {
    // Ask the planner for this rank's minimums, then run at them.
    EngineOptions probe = opt;
    probe.host_mem_bytes = 1ull << 34;
    probe.device_mem_bytes = 1ull << 34;
    probe.nvme_paths = {dir + "/probe"};
    fs::create_directories(probe.nvme_paths[0]);
    uint64_t host_min, device_min;
    {
      STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(Model(), probe));
      device_min = e->Placement().device_min_bytes;
    }
    probe.device_mem_bytes = device_min;
    probe.nvme_paths = {dir + "/probe2"};
    fs::create_directories(probe.nvme_paths[0]);
    {
      STRATA_ASSIGN_OR_RETURN(auto e, Engine::Create(Model(), probe));
      host_min = e->Placement().host_min_bytes;
    }
    opt.device_mem_bytes = device_min;
    opt.host_mem_bytes = host_min + rc.host_extra;
    opt.nvme_paths = {dir + "/swap"};
    fs::create_directories(opt.nvme_paths[0]);
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(Model(), opt));
  const int L = int(e->Layout().size());
  for (int b = 0; b < L; ++b) {
    for (int t = 0; t < int(e->Layout()[b].tensors.size()); ++t) {
      std::vector<float> v(e->Layout()[b].tensors[t].numel);
      for (size_t i = 0; i < v.size(); ++i) v[i] = InitValue(b, t, i);
      STRATA_RETURN_IF_ERROR(e->WriteParams(b, t, v));
    }
  }
  Device& d = *device;
  testing::FakeGradWrite how;
  how.dtype = rc.grad_dtype;
  if (rc.rank_grads) how.rank = comm ? comm->rank() : 0;
  how.round_to_bf16 = rc.model_rounds_bf16;
  how.average_bf16_of_ranks = rc.average_bf16_of_ranks;
  for (int64_t step = 1; step <= rc.steps; ++step) {
    STRATA_RETURN_IF_ERROR(e->BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}));
    for (int m = 0; m < rc.micro_batches; ++m) {
      STRATA_RETURN_IF_ERROR(testing::RunFakeMicroBatch(*e, d, step, m, nullptr, false, 0, how));
    }
    STRATA_ASSIGN_OR_RETURN(StepStats st, e->EndStep());
    out.norms.push_back(st.grad_norm);
    out.redone_blocks += uint64_t(st.redone_blocks);
    out.deferred_blocks += uint64_t(st.deferred_blocks);
    if (comm && comm->world_size() > 1 && st.bytes.comm == 0) {
      return Status::Aborted("a multi-rank step reported no collective bytes");
    }
    // (bf16 gradients reduce in host memory.)
    const bool host = rc.memory == CollectiveMemory::kHost || rc.grad_dtype == GradDtype::kBf16;
    if (comm && e->Placement().collective_memory !=
                    (host ? CollectiveMemory::kHost : CollectiveMemory::kDevice)) {
      return Status::Aborted(std::string("collective memory resolved to ") +
                             CollectiveMemoryName(e->Placement().collective_memory));
    }
    // The copies are the planned ones (the device plan is fixed; the prediction divides by
    // the world size in device memory).
    if (st.bytes.h2d != e->Placement().predicted_bytes.h2d ||
        st.bytes.d2h != e->Placement().predicted_bytes.d2h) {
      return Status::Aborted("copied h2d " + std::to_string(st.bytes.h2d) + " / d2h " +
                             std::to_string(st.bytes.d2h) + " bytes, planned " +
                             std::to_string(e->Placement().predicted_bytes.h2d) + " / " +
                             std::to_string(e->Placement().predicted_bytes.d2h));
    }
    out.h2d += st.bytes.h2d;
    out.d2h += st.bytes.d2h;
  }
  const int rank = comm ? comm->rank() : 0;
  for (int b = 0; b < L; ++b) {
    const BlockLayout& bl = e->Layout()[b];
    for (Component c : {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq}) {
      std::vector<float> shard(bl.shard_numel);
      STRATA_RETURN_IF_ERROR(e->ReadComponent(b, c, shard));
      std::vector<float> full(bl.padded_numel, std::nanf(""));
      std::copy(shard.begin(), shard.end(), full.begin() + uint64_t(rank) * bl.shard_numel);
      out.states.push_back(std::move(full));
    }
    for (int t = 0; t < int(bl.tensors.size()); ++t) {
      std::vector<float> p(bl.tensors[t].numel);
      STRATA_RETURN_IF_ERROR(e->ReadParams(b, t, p));  // a collective with several ranks
      out.params.push_back(std::move(p));
    }
  }
  return out;
}

void WriteOutcome(const std::string& path, const Outcome& o) {
  std::ofstream f(path, std::ios::binary);
  auto put = [&](const std::vector<std::vector<float>>& vv) {
    uint64_t n = vv.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    for (const auto& v : vv) {
      uint64_t m = v.size();
      f.write(reinterpret_cast<const char*>(&m), 8);
      f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(m * 4));
    }
  };
  put(o.states);
  put(o.params);
  uint64_t n = o.norms.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(reinterpret_cast<const char*>(o.norms.data()), std::streamsize(n * 8));
  f.write(reinterpret_cast<const char*>(&o.h2d), 8);
  f.write(reinterpret_cast<const char*>(&o.d2h), 8);
  f.write(reinterpret_cast<const char*>(&o.redone_blocks), 8);
  f.write(reinterpret_cast<const char*>(&o.deferred_blocks), 8);
}

bool ReadOutcome(const std::string& path, Outcome* o) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  auto get = [&](std::vector<std::vector<float>>* vv) {
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    vv->resize(n);
    for (auto& v : *vv) {
      uint64_t m = 0;
      f.read(reinterpret_cast<char*>(&m), 8);
      v.resize(m);
      f.read(reinterpret_cast<char*>(v.data()), std::streamsize(m * 4));
    }
  };
  get(&o->states);
  get(&o->params);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  o->norms.resize(n);
  f.read(reinterpret_cast<char*>(o->norms.data()), std::streamsize(n * 8));
  f.read(reinterpret_cast<char*>(&o->h2d), 8);
  f.read(reinterpret_cast<char*>(&o->d2h), 8);
  f.read(reinterpret_cast<char*>(&o->redone_blocks), 8);
  f.read(reinterpret_cast<char*>(&o->deferred_blocks), 8);
  return bool(f);
}

// Forks `world` ranks running `rc`; returns each rank's outcome (fails the test on a rank
// that fails or hangs). world 0: one process without a communicator (the reference; forked
// too, so the test process itself never starts OpenMP's threads, which a fork would lose).
std::vector<Outcome> RunRanks(int world, const RunConfig& rc) {
  const bool reference = world == 0 || (world == 1 && !rc.one_rank_comm);
  if (reference) world = 1;
  TempDir dir;
  const std::string rdv = dir.path() + "/rendezvous";
  fs::create_directories(rdv);
  const std::vector<int> codes = strata::testing::ForkChildren(world, [&](int r) {
    CommOptions co;
    co.rank.rank = r;
    co.rank.world_size = world;
    co.rank.local_rank = r;
    co.rank.local_world_size = world;
    co.rendezvous.path = rdv;
    co.timeout = 60s;
    auto comm =
        reference ? Result<std::unique_ptr<Communicator>>(nullptr) : CreateGlooCommunicator(co);
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, comm.status().ToString().c_str());
      return 90;
    }
    const std::string mine = dir.path() + "/rank" + std::to_string(r);
    fs::create_directories(mine);
    auto o = Run(rc, comm->get(), mine);
    if (!o.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, o.status().ToString().c_str());
      return 91;
    }
    WriteOutcome(mine + "/outcome.bin", *o);
    return 0;
  });
  std::vector<Outcome> out(world);
  for (int r = 0; r < world; ++r) {
    if (codes[r] == -SIGKILL) return {};  // a hang, reported by ForkChildren
    EXPECT_EQ(codes[r], 0) << "rank " << r << " failed";
    EXPECT_TRUE(ReadOutcome(dir.path() + "/rank" + std::to_string(r) + "/outcome.bin", &out[r]))
        << "rank " << r << " wrote no outcome";
  }
  return out;
}

// Compares each rank's shard with the single-rank states: exactly, or within `rtol`.
void ExpectShardsMatch(const Outcome& ref, const std::vector<Outcome>& ranks, double rtol) {
  ASSERT_FALSE(ranks.empty());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Outcome& o = ranks[r];
    ASSERT_EQ(o.states.size(), ref.states.size()) << "rank " << r;
    for (size_t i = 0; i < ref.states.size(); ++i) {
      const auto& a = ref.states[i];
      const auto& b = o.states[i];
      for (size_t k = 0; k < b.size(); ++k) {
        if (std::isnan(b[k])) continue;  // another rank's shard
        const float want = k < a.size() ? a[k] : 0.0f;
        if (rtol == 0) {
          ASSERT_EQ(std::memcmp(&want, &b[k], 4), 0)
              << "rank " << r << " block " << i / 3 << " component " << i % 3 << " element " << k
              << ": " << b[k] << " vs single-rank " << want;
        } else {
          ASSERT_NEAR(b[k], want, rtol * std::fabs(want) + 1e-6)
              << "rank " << r << " block " << i / 3 << " component " << i % 3 << " element " << k;
        }
      }
    }
    ASSERT_EQ(o.params.size(), ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i) {
      for (size_t k = 0; k < ref.params[i].size(); ++k) {
        // (Adam's step is relative to sqrt(v): tiny values get an absolute allowance.)
        ASSERT_NEAR(o.params[i][k], ref.params[i][k],
                    rtol * std::fabs(ref.params[i][k]) + (rtol > 0 ? 1e-6 : 0.0))
            << "ReadParams on rank " << r << ", tensor " << i << " element " << k;
      }
    }
    ASSERT_EQ(o.norms.size(), ref.norms.size());
    for (size_t s = 0; s < ref.norms.size(); ++s) {
      EXPECT_NEAR(o.norms[s], ref.norms[s], std::max(rtol, 1e-9) * ref.norms[s])
          << "rank " << r << " step " << s;
      // Every rank reports the same norm, bit for bit.
      EXPECT_EQ(o.norms[s], ranks[0].norms[s]) << "rank " << r << " step " << s;
    }
  }
}

Outcome Reference(const RunConfig& rc) {
  std::vector<Outcome> o = RunRanks(0, rc);
  return o.empty() ? Outcome{} : o[0];
}

// Each rank's state shards, bit for bit the same in two sets of runs (other ranks' shards are
// NaN: compared as bytes), and the same norms.
void ExpectRanksIdentical(const std::vector<Outcome>& a, const std::vector<Outcome>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].norms, b[r].norms) << "rank " << r;
    ASSERT_EQ(a[r].states.size(), b[r].states.size());
    for (size_t i = 0; i < a[r].states.size(); ++i) {
      ASSERT_EQ(a[r].states[i].size(), b[r].states[i].size());
      EXPECT_EQ(std::memcmp(a[r].states[i].data(), b[r].states[i].data(),
                            a[r].states[i].size() * sizeof(float)),
                0)
          << "rank " << r << " block " << i / 3 << " component " << i % 3;
    }
  }
}

class EngineMultirankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([](LogLevel, std::string_view) {});
  }
  void TearDown() override { SetLogSink(nullptr); }
};

TEST_F(EngineMultirankTest, TwoRanksMatchOneRankBitForBit) {
  RunConfig rc;
  const Outcome ref = Reference(rc);
  ExpectShardsMatch(ref, RunRanks(2, rc), 0);
}

// Collectives in host memory (pinned gather buffers, the path of gloo with a CUDA device) and
// in device memory give the same bits; device memory copies 1/N of the bytes each way.
TEST_F(EngineMultirankTest, HostAndDeviceCollectiveMemoryAgreeAndDeviceCopiesOneShard) {
  RunConfig rc;
  const Outcome ref = Reference(rc);
  rc.memory = CollectiveMemory::kHost;
  const std::vector<Outcome> host = RunRanks(2, rc);
  rc.memory = CollectiveMemory::kDevice;
  const std::vector<Outcome> device = RunRanks(2, rc);
  ExpectShardsMatch(ref, host, 0);
  ExpectShardsMatch(ref, device, 0);
  ASSERT_EQ(host.size(), 2u);
  ASSERT_EQ(device.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(device[r].h2d, 0u);
    EXPECT_EQ(device[r].h2d * 2, host[r].h2d) << "rank " << r;
    EXPECT_EQ(device[r].d2h * 2, host[r].d2h) << "rank " << r;
  }
}

// Int8 moments across ranks: each rank quantizes its part of a tensor in blocks counted from
// the tensor's start, a block a shard boundary cuts split into two partial blocks with their
// own scales (strata/state_layout.h). Each rank's shards at the minimum budgets with NVMe equal
// the unlimited ones bit for bit, and stay near the one-rank run (which has whole blocks there).
TEST_F(EngineMultirankTest, Int8MomentsShardWithTheirScales) {
  RunConfig rc;
  rc.state_format = StateFormat::kInt8;
  rc.micro_batches = 2;
  const Outcome one = Reference(rc);
  const std::vector<Outcome> unlimited = RunRanks(2, rc);
  rc.tight = true;
  ExpectRanksIdentical(unlimited, RunRanks(2, rc));
  ASSERT_EQ(unlimited.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    for (size_t i = 0; i < one.states.size(); i += 3) {  // the master weights
      for (size_t k = 0; k < unlimited[r].states[i].size(); ++k) {
        const float got = unlimited[r].states[i][k];
        if (std::isnan(got)) continue;  // another rank's shard
        const float want = k < one.states[i].size() ? one.states[i][k] : 0.0f;  // padding
        ASSERT_NEAR(got, want, 5e-3) << "rank " << r << " block " << i / 3 << " " << k;
      }
    }
  }
}

TEST_F(EngineMultirankTest, HostCollectiveMemoryAtMinimumBudgetsWithNvmeBitForBit) {
  RunConfig rc;
  rc.micro_batches = 2;
  rc.tight = true;
  rc.memory = CollectiveMemory::kHost;
  const Outcome ref = Reference(RunConfig{.micro_batches = 2});
  ExpectShardsMatch(ref, RunRanks(2, rc), 0);
}

// A communicator of one rank runs the same (trivial) collectives: how a single GPU tests the
// NCCL path. It must change nothing.
TEST_F(EngineMultirankTest, OneRankCommunicatorMatchesNoCommunicator) {
  for (CollectiveMemory m : {CollectiveMemory::kDevice, CollectiveMemory::kHost}) {
    SCOPED_TRACE(CollectiveMemoryName(m));
    RunConfig rc;
    rc.micro_batches = 2;
    rc.grad_clip = 0.05;
    const Outcome ref = Reference(rc);
    rc.memory = m;
    rc.one_rank_comm = true;
    ExpectShardsMatch(ref, RunRanks(1, rc), 0);
  }
}

// Three ranks: the average of three equal values (x + x + x) / 3 need not be x exactly, so
// the comparison allows rounding. Two ranks (below) are exact.
TEST_F(EngineMultirankTest, ThreeRanksMicroBatchesAtMinimumBudgetsWithNvme) {
  RunConfig rc;
  rc.micro_batches = 2;
  rc.tight = true;
  const Outcome ref = Reference(RunConfig{.micro_batches = 2});
  ExpectShardsMatch(ref, RunRanks(3, rc), 1e-5);
}

TEST_F(EngineMultirankTest, TwoRanksMicroBatchesAtMinimumBudgetsWithNvmeBitForBit) {
  RunConfig rc;
  rc.micro_batches = 2;
  rc.tight = true;
  const Outcome ref = Reference(RunConfig{.micro_batches = 2});
  ExpectShardsMatch(ref, RunRanks(2, rc), 0);
}

TEST_F(EngineMultirankTest, ClippingCombinesTheNormAcrossRanks) {
  RunConfig rc;
  rc.grad_clip = 0.05;  // well below the norm: every step clips
  const Outcome ref = Reference(rc);
  ASSERT_FALSE(ref.norms.empty());
  EXPECT_GT(ref.norms[0], 0.05 * 10);
  ExpectShardsMatch(ref, RunRanks(2, rc), 1e-5);
}

// Speculative updates on each rank's shard, redone where the norm combined across the ranks
// clips: the same bits as updates that wait for it, with a threshold that clips some steps.
TEST_F(EngineMultirankTest, SpeculativeUpdatesMatchWaitingOnesAcrossRanks) {
  RunConfig rc;
  rc.tight = true;
  rc.steps = 4;
  rc.grad_clip = 1e30;
  const Outcome unclipped = Reference(rc);
  ASSERT_EQ(unclipped.norms.size(), 4u);
  const auto [lo, hi] = std::minmax_element(unclipped.norms.begin(), unclipped.norms.end());
  ASSERT_LT(*lo, *hi);
  rc.grad_clip = 0.5 * (*lo + *hi);
  rc.speculation = Speculation::kOff;
  const std::vector<Outcome> waited = RunRanks(2, rc);
  rc.speculation = Speculation::kOn;
  const std::vector<Outcome> speculated = RunRanks(2, rc);
  ASSERT_EQ(waited.size(), 2u);
  ASSERT_EQ(speculated.size(), 2u);
  EXPECT_EQ(waited[0].redone_blocks, 0u);
  EXPECT_GT(speculated[0].redone_blocks, 0u);  // some step clipped after speculating
  ExpectRanksIdentical(waited, speculated);
}

// Pipelined updates across ranks (each rank's deferred updates under its next forward, the
// ranks' commit at the end of the next step): the same bits as the end-of-step order, with a
// threshold that clips some steps and not others, at the minimum budgets with NVMe.
TEST_F(EngineMultirankTest, PipelinedUpdatesMatchEndOfStepOrderAcrossRanks) {
  RunConfig rc;
  rc.tight = true;
  rc.steps = 4;
  rc.micro_batches = 2;
  rc.grad_clip = 1e30;
  const Outcome unclipped = Reference(rc);
  const auto [lo, hi] = std::minmax_element(unclipped.norms.begin(), unclipped.norms.end());
  ASSERT_LT(*lo, *hi);
  rc.grad_clip = 0.5 * (*lo + *hi);
  rc.host_extra = 8 << 20;  // the states twice over: two steps' plans fit back to back
  rc.pipeline = false;
  const std::vector<Outcome> waited = RunRanks(2, rc);
  rc.pipeline = true;
  const std::vector<Outcome> piped = RunRanks(2, rc);
  ASSERT_EQ(waited.size(), 2u);
  ASSERT_EQ(piped.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(waited[r].deferred_blocks, 0u) << "rank " << r;
    EXPECT_GT(piped[r].deferred_blocks, 0u) << "rank " << r;
  }
  ExpectRanksIdentical(waited, piped);
}

TEST_F(EngineMultirankTest, Bf16WorkingCopyGathersBytes) {
  RunConfig rc;
  rc.dtype = WorkingDtype::kBf16;
  const Outcome ref = Reference(rc);
  ExpectShardsMatch(ref, RunRanks(2, rc), 0);
}

// bf16 gradients across ranks (the ranks' gradients differ): each rank's block lands as bf16
// (half the D2H bytes of fp32), is widened on the host and reduce-scattered in fp32, so every
// rank's shards equal, bit for bit, one rank fed the average of the ranks' bf16-rounded
// gradients; at the minimum budgets with NVMe, with one and two micro-batches.
TEST_F(EngineMultirankTest, Bf16GradientsAcrossRanksMatchOneRankFedTheirRoundedAverage) {
  for (int micro_batches : {1, 2}) {
    SCOPED_TRACE("micro-batches " + std::to_string(micro_batches));
    RunConfig rc;
    rc.micro_batches = micro_batches;
    rc.tight = true;
    rc.rank_grads = true;
    RunConfig ref_rc = rc;
    ref_rc.tight = false;
    ref_rc.rank_grads = false;
    ref_rc.average_bf16_of_ranks = 2;
    const Outcome ref = Reference(ref_rc);
    rc.memory = CollectiveMemory::kHost;  // as bf16 resolves auto: the same copies
    const std::vector<Outcome> fp32 = RunRanks(2, rc);
    rc.memory = CollectiveMemory::kAuto;
    rc.grad_dtype = GradDtype::kBf16;
    const std::vector<Outcome> bf16 = RunRanks(2, rc);
    ExpectShardsMatch(ref, bf16, 0);
    ASSERT_EQ(fp32.size(), 2u);
    ASSERT_EQ(bf16.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_GT(bf16[r].d2h, 0u);
      EXPECT_EQ(bf16[r].d2h * 2, fp32[r].d2h) << "rank " << r;
      EXPECT_EQ(bf16[r].h2d, fp32[r].h2d) << "rank " << r;
    }
    // The rounding is not a no-op here: fp32 gradients give other states.
    ASSERT_EQ(fp32[0].states.size(), bf16[0].states.size());
    bool differs = false;
    for (size_t i = 0; i < fp32[0].states.size() && !differs; ++i) {
      ASSERT_EQ(fp32[0].states[i].size(), bf16[0].states[i].size());
      differs = std::memcmp(fp32[0].states[i].data(), bf16[0].states[i].data(),
                            fp32[0].states[i].size() * sizeof(float)) != 0;
    }
    EXPECT_TRUE(differs);
  }
}

// With clipping on some steps (the norm combined per rank, then across ranks: another order
// than one rank's) the exact reference is two ranks whose model rounds its gradient to bf16
// and hands over fp32: the same bits. One rank fed the rounded average agrees to rounding.
TEST_F(EngineMultirankTest, Bf16GradientsAcrossRanksWithClippingMatchTheModelsRounding) {
  RunConfig rc;
  rc.tight = true;
  rc.steps = 4;
  rc.micro_batches = 2;
  rc.rank_grads = true;
  rc.grad_dtype = GradDtype::kBf16;
  rc.grad_clip = 1e30;
  const std::vector<Outcome> unclipped = RunRanks(2, rc);
  ASSERT_EQ(unclipped.size(), 2u);
  const auto [lo, hi] = std::minmax_element(unclipped[0].norms.begin(), unclipped[0].norms.end());
  ASSERT_LT(*lo, *hi);
  rc.grad_clip = 0.5 * (*lo + *hi);  // clips some steps, not others
  const std::vector<Outcome> bf16 = RunRanks(2, rc);
  RunConfig model_rc = rc;
  model_rc.grad_dtype = GradDtype::kFp32;
  model_rc.model_rounds_bf16 = true;
  model_rc.memory = CollectiveMemory::kHost;
  const std::vector<Outcome> rounded = RunRanks(2, model_rc);
  ExpectRanksIdentical(rounded, bf16);
  RunConfig ref_rc = rc;
  ref_rc.tight = false;
  ref_rc.grad_dtype = GradDtype::kFp32;
  ref_rc.rank_grads = false;
  ref_rc.average_bf16_of_ranks = 2;
  ExpectShardsMatch(Reference(ref_rc), bf16, 1e-5);
  ASSERT_EQ(bf16.size(), 2u);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(bf16[r].d2h * 2, rounded[r].d2h) << "rank " << r;
}

// bf16 gradients reduce in host memory: auto resolves to it; an explicit 'device' is refused,
// naming both ways out.
TEST_F(EngineMultirankTest, Bf16GradientsChooseHostCollectiveMemoryAndRefuseDevice) {
  TempDir dir;
  CommOptions co;
  co.rank = RankInfo{0, 1, 0, 1, "test"};
  co.rendezvous.path = dir.path();
  auto comm = CreateGlooCommunicator(co);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  auto device = CreateHostDevice(DeviceOptions{});
  ASSERT_TRUE(device.ok());
  EngineOptions opt = BaseOptions(device->get(), RunConfig{});
  opt.comm = comm->get();
  opt.grad_dtype = GradDtype::kBf16;
  {
    auto e = Engine::Create(Model(), opt);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ((*e)->Placement().collective_memory, CollectiveMemory::kHost);
  }
  opt.collective_memory = CollectiveMemory::kDevice;
  auto e = Engine::Create(Model(), opt);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  for (const char* part :
       {"collective memory 'device'", "bf16 gradients", "'host'", "grad_dtype fp32"}) {
    EXPECT_NE(e.status().message().find(part), std::string::npos)
        << part << ": " << e.status().ToString();
  }
}

// Random models, micro-batches, clipping and budgets (minimum or unlimited) on 2 ranks:
// every run finishes (no deadlock between the comm thread's order and the plans) and
// matches one rank. The suite runs 4 fixed seeds, so that CI is repeatable;
// STRATA_TEST_SEED=random explores 4 new ones (the seed printed), STRATA_TEST_SEED=N replays one.
void RandomModelsAndBudgetsTrials(uint64_t seed, int trials) {
  for (int trial = 0; trial < trials; ++trial) {
    const uint64_t s = seed + uint64_t(trial);
    SCOPED_TRACE("replay: STRATA_TEST_SEED=" + std::to_string(s));
    std::mt19937_64 rng(s);
    g_model_seed = int64_t(s % (1ull << 62));
    RunConfig rc;
    rc.micro_batches = 1 + int(rng() % 2);
    rc.grad_clip = (rng() % 2) ? 0.05 : 0.0;
    rc.tight = (rng() % 3) != 0;
    rc.memory = (rng() % 3) == 0 ? CollectiveMemory::kHost : CollectiveMemory::kDevice;
    rc.steps = 2;
    RunConfig ref_rc = rc;
    ref_rc.tight = false;
    const Outcome ref = Reference(ref_rc);
    ExpectShardsMatch(ref, RunRanks(2, rc), rc.grad_clip > 0 ? 1e-5 : 0);
    g_model_seed = -1;
    if (::testing::Test::HasFailure()) break;
  }
}

TEST_F(EngineMultirankTest, RandomModelsAndBudgetsMatchOneRank) {
  const char* env_seed = std::getenv("STRATA_TEST_SEED");
  if (env_seed == nullptr) return RandomModelsAndBudgetsTrials(20261206, 4);
  if (std::string(env_seed) == "random") {
    return RandomModelsAndBudgetsTrials(std::random_device{}(), 4);
  }
  RandomModelsAndBudgetsTrials(std::strtoull(env_seed, nullptr, 10), 1);
}

// A seed found on 2026-12-06 whose trial (2 micro-batches, clipping 0.05, minimum budgets,
// collectives in host memory, a host plan without evictions) deadlocked both ranks until the
// 120 s deadline: the gather of access 12 was moved ahead of the reduce-scatter of access 7,
// but its gather buffer is freed by the H2D copy of access 9, which the feeder enqueues after
// freeing the gradient buffer of access 8, whose D2H copy waits for that reduce-scatter.
TEST_F(EngineMultirankTest, HostCollectivesSeed1138143941DoNotDeadlock) {
  RandomModelsAndBudgetsTrials(1138143941, 1);
}

// Rank 1 passes another host budget, optimizer group and gradient dtype, rank 2 another
// beta1 and no pipelining: every rank refuses at Create, listing every option that differs with
// each value and its ranks, instead of deadlocking later on mismatched collectives (or, for the
// group, silently updating a tensor's shards with other hyperparameters).
TEST_F(EngineMultirankTest, RanksWithDifferentOptionsAreRefusedAtCreate) {
  TempDir dir;
  const std::string rdv = dir.path() + "/rendezvous";
  fs::create_directories(rdv);
  const std::vector<int> codes = strata::testing::ForkChildren(3, [&](int r) {
    std::string message = "no error";
    {
      CommOptions co;
      co.rank = RankInfo{r, 3, r, 3, "test"};
      co.rendezvous.path = rdv;
      co.timeout = 60s;
      auto comm = CreateGlooCommunicator(co);
      auto device = CreateHostDevice(DeviceOptions{});
      if (!comm.ok() || !device.ok()) return 90;
      EngineOptions opt = BaseOptions(device->get(), RunConfig{});
      opt.comm = comm->get();
      opt.host_mem_bytes = r == 1 ? (32u << 20) : (64u << 20);
      if (r == 2) opt.beta1 = 0.8;
      if (r == 2) opt.pipeline_updates = false;
      if (r == 1) opt.grad_dtype = GradDtype::kBf16;
      std::vector<BlockSpec> model = Model();
      if (r == 1) model[0].tensors[0].group = 1;  // another optimizer group: other numbers
      auto e = Engine::Create(model, opt);
      if (!e.ok()) message = e.status().ToString();
    }
    std::ofstream(dir.path() + "/msg" + std::to_string(r)) << message;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
  for (int r = 0; r < 3; ++r) {
    std::ifstream f(dir.path() + "/msg" + std::to_string(r));
    const std::string msg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + msg);
    EXPECT_NE(msg.find("InvalidArgument"), std::string::npos);
    EXPECT_NE(msg.find("host_mem_bytes"), std::string::npos);
    EXPECT_NE(msg.find("host_mem_bytes (--host-mem): 67108864 on ranks 0, 2 vs 33554432 on rank 1"),
              std::string::npos);
    EXPECT_NE(
        msg.find("; beta1: 0.90000000000000002 on ranks 0, 1 vs 0.80000000000000004 on rank 2"),
        std::string::npos);
    EXPECT_NE(msg.find("optimizer groups): "), std::string::npos);
    EXPECT_NE(msg.find("pipelined updates (--pipeline): 1 on ranks 0, 1 vs 0 on rank 2"),
              std::string::npos);
    EXPECT_NE(msg.find("gradients device -> host (--grad-dtype): fp32 on ranks 0, 2 vs bf16 on "
                       "rank 1"),
              std::string::npos);
  }
}

// An explicit host communicator (here the same gloo one) is accepted; auto on a HostDevice
// resolves to device memory.
TEST_F(EngineMultirankTest, ExplicitHostCommAndAutoCollectiveMemory) {
  TempDir dir;
  CommOptions co;
  co.rank = RankInfo{0, 1, 0, 1, "test"};
  co.rendezvous.path = dir.path();
  co.store_prefix = "a";
  auto comm = CreateGlooCommunicator(co);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  auto device = CreateHostDevice(DeviceOptions{});
  ASSERT_TRUE(device.ok());
  EngineOptions opt = BaseOptions(device->get(), RunConfig{});
  opt.comm = comm->get();
  opt.host_comm = comm->get();
  auto e = Engine::Create(Model(), opt);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->Placement().collective_memory, CollectiveMemory::kDevice);
}

TEST_F(EngineMultirankTest, WorldSizeWithoutCommunicatorIsRefused) {
  auto device = CreateHostDevice(DeviceOptions{});
  ASSERT_TRUE(device.ok());
  EngineOptions opt;
  opt.device = device->get();
  opt.world_size = 2;
  auto e = Engine::Create(Model(), opt);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("comm"), std::string::npos) << e.status().ToString();
}

}  // namespace
}  // namespace strata
