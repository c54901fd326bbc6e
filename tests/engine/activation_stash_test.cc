// The activation stash (Engine::StashActivation / FetchActivation) on a HostDevice with real
// scratch files in a temp folder (io_uring, or posix where it is unavailable): every fetched
// byte equals the stashed one over steps, orders and sizes with most activations on NVMe; the
// planner's minimum and its messages; EIO, flipped bits and a full disk on the scratch files;
// prefetch along the learned sequence; and training unchanged by the stash.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/plan.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/fault_injection.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

constexpr uint64_t kActBytes = 64 << 10;

std::vector<BlockSpec> SmallModel() {
  std::mt19937_64 rng(7);
  return RandomModel(rng, 2);
}

struct StashConfig {
  uint64_t host_mem = 0;  // 0 = unlimited
  bool nvme = true;
  int folders = 1;  // NVMe folders (subfolders of the test's), the scratch files striped
  int count = 12;
  uint64_t bytes = kActBytes;
  IoBackendFactory io_factory;
  std::string trace_path;
};

struct StashFixture {
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;
  char* src = nullptr;  // device memory: `count` regions of `bytes`
  char* dst = nullptr;
};

Result<StashFixture> MakeStashEngine(const std::vector<BlockSpec>& specs, const StashConfig& c,
                                     const std::string& dir) {
  StashFixture f;
  STRATA_ASSIGN_OR_RETURN(f.device, CreateHostDevice(DeviceOptions{}));
  EngineOptions opt;
  opt.device = f.device.get();
  opt.host_mem_bytes = c.host_mem;
  for (int i = 0; c.nvme && i < c.folders; ++i) {
    opt.nvme_paths.push_back(c.folders == 1 ? dir : dir + "/f" + std::to_string(i));
    std::filesystem::create_directories(opt.nvme_paths.back());
  }
  opt.nvme_stripe_bytes = 64 << 10;
  opt.io_backend_factory = c.io_factory;
  opt.activation_bytes = c.bytes;
  opt.activation_count = c.count;
  opt.trace_path = c.trace_path;
  opt.weight_decay = 0.1;  // as the harness's MakeEngine: Train is the reference
  STRATA_ASSIGN_OR_RETURN(f.engine, Engine::Create(specs, opt));
  STRATA_RETURN_IF_ERROR(WriteInitialParams(*f.engine));
  STRATA_ASSIGN_OR_RETURN(void* src, f.device->Allocate(c.count * c.bytes));
  STRATA_ASSIGN_OR_RETURN(void* dst, f.device->Allocate(c.count * c.bytes));
  f.src = static_cast<char*>(src);
  f.dst = static_cast<char*>(dst);
  return f;
}

// The placement's host minimum for these options, probed with a huge budget.
PlacementReport Probe(const std::vector<BlockSpec>& specs, StashConfig c, const std::string& dir) {
  c.host_mem = 1ull << 34;
  auto f = MakeStashEngine(specs, c, dir);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? f->engine->Placement() : PlacementReport{};
}

// One step's activation calls: which keys, in which order, with which sizes.
struct StepPlan {
  std::vector<uint32_t> keys;            // stash order
  std::vector<uint64_t> sizes;           // per key (same index)
  std::vector<int> fetch;                // indices into keys, fetch order
  std::vector<bool> again;               // per fetch: fetched again later (last=false now)
  std::chrono::milliseconds compute{0};  // before each fetch: the "backward" it overlaps
};

// A step: BeginStep, stash every key from random contents (the source is overwritten as soon
// as each stash's event allows), the fake model's micro-batch, fetches checked byte for
// byte, EndStep. Returns the step's stats, or the first error (with *fetched the fetches that
// came back right before it).
Result<StepStats> RunStashStep(StashFixture& f, int64_t step, const StepPlan& p, uint64_t seed,
                               int* fetched = nullptr) {
  Engine& e = *f.engine;
  Device& d = *f.device;
  std::mt19937_64 rng(seed);
  STRATA_RETURN_IF_ERROR(e.BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}));
  std::vector<std::vector<char>> want(p.keys.size());
  const uint64_t region = e.Placement().activation_slot_bytes;
  for (size_t i = 0; i < p.keys.size(); ++i) {
    want[i].resize(p.sizes[i]);
    for (char& ch : want[i]) ch = char(rng());
    STRATA_RETURN_IF_ERROR(d.SynchronizeLane(Lane::kCompute));
    std::memcpy(f.src + i * region, want[i].data(), p.sizes[i]);
    STRATA_ASSIGN_OR_RETURN(EventPtr ev,
                            e.StashActivation(p.keys[i], f.src + i * region, p.sizes[i]));
    STRATA_RETURN_IF_ERROR(ev->Synchronize());
    std::memset(f.src + i * region, 0xAB, p.sizes[i]);  // the stash must not read it now
  }
  STRATA_RETURN_IF_ERROR(testing::RunFakeMicroBatch(e, d, step, 0));
  int n = 0;
  for (size_t j = 0; j < p.fetch.size(); ++j) {
    const int i = p.fetch[j];
    if (p.compute.count()) std::this_thread::sleep_for(p.compute);
    char* out = f.dst + i * region;
    std::memset(out, 0, p.sizes[i]);
    STRATA_RETURN_IF_ERROR(e.FetchActivation(p.keys[i], out, /*last=*/!p.again[j]));
    STRATA_RETURN_IF_ERROR(d.SynchronizeLane(Lane::kCompute));  // compute waits for the copy
    if (std::memcmp(out, want[i].data(), p.sizes[i]) != 0) {
      return Status::Aborted("activation " + std::to_string(p.keys[i]) + " came back wrong");
    }
    if (fetched) *fetched = ++n;
  }
  return e.EndStep();
}

StepPlan Plan(std::vector<uint32_t> keys, std::mt19937_64& rng, uint64_t max_bytes) {
  static const uint64_t kOdd[] = {1, 17, 4095, 4096, 4097};
  StepPlan p;
  p.keys = std::move(keys);
  for (size_t i = 0; i < p.keys.size(); ++i) {
    p.sizes.push_back(i < 5 ? kOdd[i] : (i % 3 == 0 ? max_bytes : 1 + rng() % max_bytes));
  }
  for (int i = int(p.keys.size()) - 1; i >= 0; --i) p.fetch.push_back(i);  // backward
  p.again.assign(p.fetch.size(), false);
  return p;
}

// Most activations on NVMe (3 host slots for 12), over steps whose orders are the reverse of
// the stash order (learned, then prefetched), a shuffled one, and one that fetches some keys
// twice; the same keys every step, new contents each time.
void RoundTrip(const IoBackendFactory& factory, int folders = 1) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig c;
  c.io_factory = factory;
  c.folders = folders;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const PlacementReport& rep = f->engine->Placement();
  ASSERT_EQ(rep.activation_host_slots, 3);
  ASSERT_GT(rep.activation_nvme_bytes, 0u);
  std::mt19937_64 rng(11);
  std::vector<uint32_t> keys;
  for (int i = 0; i < c.count; ++i) keys.push_back(uint32_t(1000 + 37 * i));
  for (int64_t step = 1; step <= 5; ++step) {
    StepPlan p = Plan(keys, rng, c.bytes);
    if (step == 3) std::shuffle(p.fetch.begin(), p.fetch.end(), rng);
    if (step == 4) {  // every third key fetched twice: first with last=false
      std::vector<int> order;
      std::vector<bool> again;
      for (int i : p.fetch) {
        if (i % 3 == 0) order.push_back(i), again.push_back(true);
        order.push_back(i), again.push_back(false);
      }
      p.fetch = order;
      p.again = again;
    }
    auto st = RunStashStep(*f, step, p, 100 + step);
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.status().ToString();
    uint64_t stashed = 0, fetched = 0;
    for (uint64_t s : p.sizes) stashed += s;
    for (size_t j = 0; j < p.fetch.size(); ++j) fetched += p.sizes[p.fetch[j]];
    EXPECT_EQ(st->activation_bytes.d2h, stashed);
    EXPECT_EQ(st->activation_bytes.h2d, fetched);
    EXPECT_GT(st->activation_bytes.nvme_write, 0u) << "step " << step;
    EXPECT_GT(st->activation_bytes.nvme_read, 0u) << "step " << step;
    // The timeline counts the stash's copies and transfers with everything else.
    EXPECT_GE(st->bytes.d2h, st->activation_bytes.d2h);
    EXPECT_GE(st->bytes.nvme_read, st->activation_bytes.nvme_read);
    EXPECT_LE(st->peak_host_bytes, c.host_mem);
  }
}

TEST(ActivationStashTest, RoundTripExactThroughNvme) { RoundTrip(nullptr); }

TEST(ActivationStashTest, RoundTripExactPosix) {
  RoundTrip([](IoBackendOptions o) {
    o.kind = IoBackendKind::kPosix;
    return CreateIoBackend(o);
  });
}

TEST(ActivationStashTest, RoundTripExactStripedOverTwoFolders) {
  RoundTrip(nullptr, /*folders=*/2);
}

// The planner's rule over random models, counts, sizes and budgets: the reported host minimum
// is a threshold (one byte below refused, at it and above planned), the stash gets at least
// its minimum and never more slots than activations, and the states and the slots together
// stay within the budget.
TEST(ActivationStashTest, PlannerMinimumIsAThreshold) {
  using engine_internal::PlanOptions;
  using engine_internal::PlanPlacement;
  std::mt19937_64 rng(24);
  for (int trial = 0; trial < 60; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const auto specs = RandomModel(rng, 1 + int(rng() % 4));
    auto layout = engine_internal::ComputeLayout(specs, 64, 1);
    ASSERT_TRUE(layout.ok());
    PlanOptions o;
    o.nvme = rng() % 3 != 0;
    o.nvme_folders = o.nvme ? 1 + int(rng() % 3) : 0;
    o.micro_batches = 1 + int(rng() % 2);
    o.clip = rng() % 2;
    o.activation_count = 1 + int(rng() % 20);
    o.activation_bytes = 1 + rng() % (256 << 10);
    o.host_budget = 1ull << 40;
    auto roomy = PlanPlacement(*layout, o);
    ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
    const uint64_t min = roomy->report.host_min_bytes;
    const uint64_t slot = roomy->report.activation_slot_bytes;
    EXPECT_EQ(slot % 4096, 0u);
    o.host_budget = min - 1;
    auto below = PlanPlacement(*layout, o);
    ASSERT_FALSE(below.ok()) << "min " << min;
    EXPECT_EQ(below.status().code(), StatusCode::kOutOfMemory);
    for (uint64_t budget : {min, min + rng() % (4 * slot + 1), min + rng() % (64 * slot + 1)}) {
      o.host_budget = budget;
      auto at = PlanPlacement(*layout, o);
      ASSERT_TRUE(at.ok()) << "budget " << budget << " min " << min << ": "
                           << at.status().ToString();
      const PlacementReport& r = at->report;
      const int least = o.nvme ? std::min(o.activation_count, 3) : o.activation_count;
      EXPECT_GE(r.activation_host_slots, least);
      EXPECT_LE(r.activation_host_slots, o.activation_count);
      EXPECT_EQ(r.activation_nvme_bytes > 0, r.activation_host_slots < o.activation_count);
      EXPECT_LE(
          at->resident_bytes + at->cache_capacity + at->staging_bytes + r.activation_host_bytes,
          budget);
    }
  }
}

TEST(ActivationStashTest, AllInHostMemoryWithoutNvme) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig c;
  c.nvme = false;
  c.count = 5;
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->engine->Placement().activation_host_slots, 5);
  EXPECT_EQ(f->engine->Placement().activation_nvme_bytes, 0u);
  std::mt19937_64 rng(3);
  StepPlan p = Plan({4, 3, 2, 1, 0}, rng, c.bytes);
  std::shuffle(p.fetch.begin(), p.fetch.end(), rng);
  auto st = RunStashStep(*f, 1, p, 5);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->activation_bytes.nvme_write, 0u);
  // The calls' own checks.
  Engine& e = *f->engine;
  EXPECT_EQ(e.StashActivation(1, f->src, 4).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.BeginStep(StepArgs{}).ok());
  EXPECT_EQ(e.StashActivation(1, f->src, c.bytes + 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(e.FetchActivation(9, f->dst, true).code(), StatusCode::kInvalidArgument);
  for (uint32_t k = 0; k < 5; ++k) ASSERT_TRUE(e.StashActivation(k, f->src, 8).ok());
  EXPECT_EQ(e.StashActivation(0, f->src, 8).status().code(), StatusCode::kInvalidArgument);
  Status more = e.StashActivation(5, f->src, 8).status();
  EXPECT_EQ(more.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(more.message().find("activation_count 5"), std::string::npos) << more.ToString();
  ASSERT_TRUE(testing::RunFakeMicroBatch(e, *f->device, 2, 0).ok());
  ASSERT_TRUE(e.EndStep().ok());  // drops the five still live
  ASSERT_TRUE(e.BeginStep(StepArgs{}).ok());
  EXPECT_EQ(e.FetchActivation(0, f->dst, true).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.StashActivation(0, f->src, 8).ok());  // the key is free again
  ASSERT_TRUE(testing::RunFakeMicroBatch(e, *f->device, 3, 0).ok());
  ASSERT_TRUE(e.EndStep().ok());
}

// The minimum is the states' own plus 3 slots with NVMe (all of them without); it is refused
// one byte below and works at it; without NVMe the message names both ways out.
TEST(ActivationStashTest, BudgetsAndReport) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig none;
  none.count = 0;
  const uint64_t states_min = Probe(specs, none, dir.path()).host_min_bytes;
  StashConfig c;
  const PlacementReport roomy = Probe(specs, c, dir.path());
  EXPECT_EQ(roomy.activation_slot_bytes, kActBytes);
  EXPECT_EQ(roomy.activation_count, c.count);
  EXPECT_EQ(roomy.activation_host_slots, c.count);  // a huge budget holds them all
  EXPECT_EQ(roomy.activation_nvme_bytes, 0u);
  EXPECT_EQ(roomy.host_min_bytes, states_min + 3 * kActBytes);
  EXPECT_NE(roomy.ToString().find("activations 12 slots of 64.0 KiB"), std::string::npos)
      << roomy.ToString();

  c.host_mem = roomy.host_min_bytes - 1;
  auto below = MakeStashEngine(specs, c, dir.path());
  ASSERT_FALSE(below.ok());
  EXPECT_EQ(below.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(below.status().message().find("activation stash"), std::string::npos);
  EXPECT_NE(below.status().message().find(std::to_string(roomy.host_min_bytes) + " bytes"),
            std::string::npos)
      << below.status().ToString();

  c.host_mem = roomy.host_min_bytes;
  auto at = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  const PlacementReport& rep = at->engine->Placement();
  EXPECT_EQ(rep.activation_host_slots, 3);
  EXPECT_EQ(rep.activation_host_bytes, 3 * kActBytes);
  EXPECT_EQ(rep.activation_nvme_bytes, c.count * kActBytes);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/strata.activations.rank0.0-of-1"));
  std::mt19937_64 rng(5);
  std::vector<uint32_t> keys;
  for (int i = 0; i < c.count; ++i) keys.push_back(uint32_t(i));
  auto st = RunStashStep(*at, 1, Plan(keys, rng, c.bytes), 9);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  at->engine.reset();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/strata.activations.rank0.0-of-1"))
      << "the scratch file outlived its engine";

  StashConfig host_only;
  host_only.nvme = false;
  host_only.count = 8;
  host_only.host_mem = 1ull << 34;
  const uint64_t all_host_min = Probe(specs, host_only, dir.path()).host_min_bytes;
  host_only.host_mem = all_host_min - 4096;
  auto refused = MakeStashEngine(specs, host_only, dir.path());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfMemory);
  const std::string& msg = refused.status().message();
  EXPECT_NE(msg.find(std::to_string(all_host_min) + " bytes) of --host-mem"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--nvme"), std::string::npos) << msg;
  host_only.host_mem = all_host_min;
  auto fits = MakeStashEngine(specs, host_only, dir.path());
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(fits->engine->Placement().activation_host_slots, 8);
}

// PlacementReport::activation_*_capacity is what Create admits: without NVMe every count up
// to the host capacity works and one more is refused, over random budgets; with NVMe the host
// capacity is the slots the states leave and the NVMe capacity the folder's free space; with
// no host budget nothing bounds them.
TEST(ActivationStashTest, CapacityIsWhatCreateAdmits) {
  TempDir dir;
  const auto specs = SmallModel();
  std::mt19937_64 rng(31);
  StashConfig host_only;
  host_only.nvme = false;
  host_only.count = 2;
  const uint64_t min2 = Probe(specs, host_only, dir.path()).host_min_bytes;
  for (int trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    host_only.count = 2;
    host_only.host_mem = min2 + rng() % (20 * kActBytes);
    auto probe = MakeStashEngine(specs, host_only, dir.path());
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    const int64_t cap = probe->engine->Placement().activation_host_capacity;
    EXPECT_EQ(probe->engine->Placement().activation_nvme_capacity, 0);
    probe->engine.reset();
    ASSERT_GE(cap, 2);
    host_only.count = int(cap);
    auto at = MakeStashEngine(specs, host_only, dir.path());
    ASSERT_TRUE(at.ok()) << "count " << cap << ": " << at.status().ToString();
    EXPECT_EQ(at->engine->Placement().activation_host_slots, cap);
    EXPECT_EQ(at->engine->Placement().activation_host_capacity, cap);
    at->engine.reset();
    host_only.count = int(cap) + 1;
    auto above = MakeStashEngine(specs, host_only, dir.path());
    ASSERT_FALSE(above.ok()) << "count " << cap + 1;
    EXPECT_EQ(above.status().code(), StatusCode::kOutOfMemory);
  }

  StashConfig c;  // 12 activations, NVMe
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes + 2 * kActBytes;
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const PlacementReport& rep = f->engine->Placement();
  // The slots the states leave: at least the 3-slot minimum, all the stash's when fewer than 12.
  EXPECT_GE(rep.activation_host_capacity, 3);
  EXPECT_LE(rep.activation_host_capacity, 5);
  EXPECT_EQ(rep.activation_host_slots, rep.activation_host_capacity);
  const std::filesystem::space_info space = std::filesystem::space(dir.path());
  const int64_t scratch =
      int64_t(std::filesystem::file_size(dir.path() + "/strata.activations.rank0.0-of-1"));
  EXPECT_EQ(scratch, 12 * int64_t(kActBytes));
  // The free space now plus the file's, within what other writers changed meanwhile.
  const int64_t expect = (int64_t(space.available) + scratch) / int64_t(kActBytes);
  EXPECT_NEAR(double(rep.activation_nvme_capacity), double(expect), double(expect) / 100 + 64);
  EXPECT_NE(rep.ToString().find("the budgets admit " +
                                std::to_string(rep.activation_host_capacity) + " in host memory"),
            std::string::npos)
      << rep.ToString();
  f->engine.reset();

  StashConfig unlimited;
  unlimited.nvme = false;
  auto u = MakeStashEngine(specs, unlimited, dir.path());  // host_mem 0: no host budget
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->engine->Placement().activation_host_capacity, -1);
}

// A factory whose `target`-th backend (counting from 1; the stash's is made after the swap
// store's) injects `faults`; `made` counts the calls and `faulty` points at that backend.
struct TargetedFaults {
  std::shared_ptr<int> made = std::make_shared<int>(0);
  std::shared_ptr<IoBackend*> faulty = std::make_shared<IoBackend*>(nullptr);
  IoBackendFactory Factory(int target, FaultInjectionOptions faults) const {
    return [made = made, faulty = faulty, target,
            faults](const IoBackendOptions& o) -> Result<std::unique_ptr<IoBackend>> {
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> b, CreateIoBackend(o));
      if (++*made != target) return b;
      auto wrapped = CreateFaultInjectionBackend(std::move(b), faults);
      *faulty = wrapped.get();
      return wrapped;
    };
  }
};

// Which backend an engine of `c` makes for the stash: the last one (after the swap store's).
int StashBackend(const std::vector<BlockSpec>& specs, StashConfig c, const std::string& dir) {
  TargetedFaults count;
  c.io_factory = count.Factory(-1, {});
  auto f = MakeStashEngine(specs, c, dir);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return *count.made;
}

// Runs one step of 12 activations (3 host slots) with `faults` on the stash's backend; the
// fetches before the failure are right (RunStashStep checks), the failure is `want`, names
// the scratch file, and the engine refuses the next step.
void FaultStep(FaultInjectionOptions faults, StatusCode want, const std::string& what) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig c;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;
  TargetedFaults t;
  c.io_factory = t.Factory(StashBackend(specs, c, dir.path()), faults);
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_NE(*t.faulty, nullptr);
  std::mt19937_64 rng(5);
  std::vector<uint32_t> keys;
  for (int i = 0; i < c.count; ++i) keys.push_back(uint32_t(70 + i));
  int fetched = 0;
  auto st = RunStashStep(*f, 1, Plan(keys, rng, c.bytes), 9, &fetched);
  ASSERT_FALSE(st.ok()) << "the fault went unnoticed";
  EXPECT_EQ(st.status().code(), want) << st.status().ToString();
  EXPECT_NE(st.status().message().find(what), std::string::npos) << st.status().ToString();
  EXPECT_NE(st.status().ToString().find("strata.activations.rank0.0-of-1"), std::string::npos)
      << st.status().ToString();
  EXPECT_NE(st.status().message().find("activation 7"), std::string::npos)
      << st.status().ToString();
  EXPECT_GE(fetched, 2);  // the two keys in host memory came back first
  EXPECT_GE(InjectedFaults(**t.faulty)->total(), 1u);
  auto end = f->engine->EndStep();
  EXPECT_FALSE(end.ok());
  EXPECT_FALSE(f->engine->BeginStep(StepArgs{}).ok()) << "a step after the failure";
}

TEST(ActivationStashTest, ReadEioFailsTheStep) {
  FaultInjectionOptions faults;
  faults.eio_read_at = 1;
  FaultStep(faults, StatusCode::kIOError, "reading");
}

TEST(ActivationStashTest, FlippedBitOnReadIsCorruption) {
  FaultInjectionOptions faults;
  faults.flip_read_at = 2;
  FaultStep(faults, StatusCode::kCorruption, "checksum mismatch");
}

TEST(ActivationStashTest, FlippedBitOnDiskIsCorruption) {
  FaultInjectionOptions faults;
  // The 7th spill (key index 6, a full 64 KiB: no padding for the bit to land in) puts the
  // damage in the file; reading it back finds it.
  faults.flip_write_at = 7;
  FaultStep(faults, StatusCode::kCorruption, "checksum mismatch");
}

// A hard link planted under the scratch file's name is refused, and the file it names is
// neither written nor removed; a plain file left by a crashed run is taken over.
TEST(ActivationStashTest, PlantedScratchFileIsRefusedAndLeftAlone) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig c;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;
  const std::string name = dir.path() + "/strata.activations.rank0.0-of-1";
  const std::string victim = dir.path() + "/victim";
  { std::ofstream(victim) << "keep me"; }
  std::filesystem::create_hard_link(victim, name);
  auto refused = MakeStashEngine(specs, c, dir.path());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not a plain regular file"), std::string::npos)
      << refused.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(name));
  std::ifstream in(victim);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "keep me");
  std::filesystem::remove(name);
  { std::ofstream(name) << "left by a crashed run"; }
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(std::filesystem::status(name).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// A killed run leaves its scratch file. The next engine of that rank takes it over when it
// spills, and removes the ones it does not use (another folder count, or no spill) unless
// another engine holds one, or it is not a plain file; other ranks' files are not its own.
TEST(ActivationStashTest, LeftoverScratchFilesAreTakenOverOrRemoved) {
  TempDir dir;
  const auto specs = SmallModel();
  const std::string d = dir.path() + "/";
  const auto plant = [&](const std::string& name) {
    std::ofstream(d + name) << "left by a killed run";
  };
  plant("strata.activations.rank0.0-of-1");
  plant("strata.activations.rank0.1-of-2");
  plant("strata.activations.rank1.0-of-1");  // another rank's
  plant("strata.activations.rank0.5-of-9");  // held by a live engine (this flock)
  const int held = open((d + "strata.activations.rank0.5-of-9").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);
  plant("victim");
  std::filesystem::create_hard_link(d + "victim", d + "strata.activations.rank0.7-of-9");
  StashConfig roomy;  // unlimited host budget: nothing spills
  auto f = MakeStashEngine(specs, roomy, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->engine->Placement().activation_nvme_bytes, 0u);
  EXPECT_FALSE(std::filesystem::exists(d + "strata.activations.rank0.0-of-1"));
  EXPECT_FALSE(std::filesystem::exists(d + "strata.activations.rank0.1-of-2"));
  EXPECT_TRUE(std::filesystem::exists(d + "strata.activations.rank1.0-of-1"));
  EXPECT_TRUE(std::filesystem::exists(d + "strata.activations.rank0.5-of-9"));
  EXPECT_TRUE(std::filesystem::exists(d + "strata.activations.rank0.7-of-9"));
  f->engine.reset();
  close(held);

  StashConfig c;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;  // 3 host slots: it spills
  plant("strata.activations.rank0.0-of-1");
  plant("strata.activations.rank0.1-of-2");
  auto spills = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(spills.ok()) << spills.status().ToString();
  EXPECT_EQ(std::filesystem::file_size(d + "strata.activations.rank0.0-of-1"),
            c.count * kActBytes);  // taken over
  EXPECT_FALSE(std::filesystem::exists(d + "strata.activations.rank0.1-of-2"));
  std::mt19937_64 rng(5);
  std::vector<uint32_t> keys;
  for (int i = 0; i < c.count; ++i) keys.push_back(uint32_t(i));
  auto st = RunStashStep(*spills, 1, Plan(keys, rng, c.bytes), 9);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_GT(st->activation_bytes.nvme_write, 0u);
  spills->engine.reset();
  EXPECT_FALSE(std::filesystem::exists(d + "strata.activations.rank0.0-of-1"));
}

TEST(ActivationStashTest, FullDiskRefusedAtCreate) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig c;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;
  TargetedFaults t;
  FaultInjectionOptions faults;
  faults.enospc = 1.0;
  c.io_factory = t.Factory(StashBackend(specs, c, dir.path()), faults);
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kOutOfMemory) << f.status().ToString();
  EXPECT_NE(f.status().message().find("folder " + dir.path()), std::string::npos)
      << f.status().ToString();
  EXPECT_NE(f.status().message().find(std::to_string(c.count * kActBytes) + " bytes"),
            std::string::npos)
      << f.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/strata.activations.rank0.0-of-1"));
}

// Step 1 learns the sequence and waits for every read; later steps with the same sequence
// read ahead under the "backward" between fetches and never wait; a step that departs from
// it runs without prefetch and is learned in its place.
TEST(ActivationStashTest, PrefetchAlongTheLearnedSequence) {
  TempDir dir;
  const auto specs = SmallModel();
  StashConfig c;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;
  c.trace_path = dir.path() + "/trace.json";
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::mt19937_64 rng(21);
  std::vector<uint32_t> keys;
  for (int i = 0; i < c.count; ++i) keys.push_back(uint32_t(i));
  StepPlan p = Plan(keys, rng, c.bytes);
  p.compute = std::chrono::milliseconds(30);
  StepPlan shuffled = p;
  std::shuffle(shuffled.fetch.begin(), shuffled.fetch.end(), rng);
  const StepPlan* plans[] = {&p, &p, &p, &shuffled, &shuffled};
  std::vector<int64_t> waits;
  for (int64_t step = 1; step <= 5; ++step) {
    auto st = RunStashStep(*f, step, *plans[step - 1], 7 * step);
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.status().ToString();
    waits.push_back(st->activation_fetch_waits);
  }
  EXPECT_GT(waits[0], 0) << "step 1 has nothing learned to prefetch with";
  EXPECT_EQ(waits[1], 0) << "step 2 follows the learned sequence";
  EXPECT_EQ(waits[2], 0);
  EXPECT_EQ(waits[4], 0) << "step 5 follows the sequence step 4 taught";
  f->engine.reset();  // closes the trace
  std::ifstream in(c.trace_path);
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* label : {"act 0 write", "act 0 read", "act 11 stash", "act 11 fetch"}) {
    EXPECT_NE(trace.find(label), std::string::npos) << label;
  }
}

// The stash does not touch the states: training with activations going through NVMe ends in
// the same states as training without them, bit for bit.
TEST(ActivationStashTest, TrainingUnchangedByTheStash) {
  TempDir dir;
  const auto specs = SmallModel();
  auto ref = Train(specs, RunConfig{}, 3);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  StashConfig c;
  c.host_mem = Probe(specs, c, dir.path()).host_min_bytes;
  auto f = MakeStashEngine(specs, c, dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::mt19937_64 rng(2);
  std::vector<uint32_t> keys;
  for (int i = 0; i < c.count; ++i) keys.push_back(uint32_t(5 * i));
  for (int64_t step = 1; step <= 3; ++step) {
    auto st = RunStashStep(*f, step, Plan(keys, rng, c.bytes), step);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
  }
  auto got = States(*f->engine);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(BitIdentical(ref->states, *got));
}

}  // namespace
}  // namespace strata
