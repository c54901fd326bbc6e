// The planner on its own (engine/plan.h): layout, schedules, the device plans and the order
// of the collectives, each plan replayed against a simple model of what its executor does
// (tests/engine/plan_replay.h), over random models, schedules and budgets. Placement and its
// minimums: plan_placement_test.cc.
#include "engine/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tests/engine/plan_replay.h"

namespace strata::engine_internal {
namespace {

// ---------------------------------------------------------------------------------------
// Layout and schedule
// ---------------------------------------------------------------------------------------

TEST(PlanLayoutTest, TensorsAreAlignedAndShardsEven) {
  std::mt19937_64 rng(7);
  for (int world : {1, 2, 3, 4}) {
    for (uint32_t align : {1u, 4u, 64u, 1000u}) {
      auto layout = ComputeLayout(RandomModel(rng, 4), align, world);
      ASSERT_TRUE(layout.ok()) << layout.status().ToString();
      for (const BlockLayout& b : *layout) {
        uint64_t end = 0, numel = 0;
        for (const TensorLayout& t : b.tensors) {
          EXPECT_EQ(t.offset % align, 0u);
          EXPECT_GE(t.offset, end);
          end = t.offset + t.numel;
          numel += t.numel;
        }
        EXPECT_EQ(b.numel, numel);
        EXPECT_GE(b.padded_numel, end);
        EXPECT_EQ(b.padded_numel % (uint64_t(align) * uint64_t(world)), 0u);
        EXPECT_EQ(b.shard_numel * uint64_t(world), b.padded_numel);
        EXPECT_LT(b.padded_numel - end, uint64_t(align) * uint64_t(world) + align);
      }
    }
  }
}

TEST(PlanLayoutTest, BadSpecsAreRefusedByName) {
  auto spec = [](std::string block, std::string tensor, std::vector<int64_t> shape) {
    return BlockSpec{std::move(block), {TensorSpec{std::move(tensor), std::move(shape), true}}};
  };
  struct Case {
    std::vector<BlockSpec> blocks;
    uint32_t align;
    int world;
    std::string want;
  } cases[] = {
      {{spec("a", "w", {2})}, 0, 1, "tensor_alignment"},
      {{spec("a", "w", {2})}, 1, 0, "world_size"},
      {{}, 1, 1, "at least one block"},
      {{spec("", "w", {2})}, 1, 1, "empty name"},
      {{spec("a", "w", {2}), spec("a", "v", {2})}, 1, 1, "two blocks are named 'a'"},
      {{BlockSpec{"a", {}}}, 1, 1, "block 'a' has no tensors"},
      {{spec("a", "", {2})}, 1, 1, "empty or repeated"},
      {{spec("a", "w", {})}, 1, 1, "'a.w' has no shape"},
      {{spec("a", "w", {3, 0})}, 1, 1, "dimension 0"},
  };
  for (const Case& c : cases) {
    auto r = ComputeLayout(c.blocks, c.align, c.world);
    ASSERT_FALSE(r.ok()) << c.want;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().message();
  }
}

TEST(PlanScheduleTest, StandardAndDeclaredOrdersRepeatPerMicroBatch) {
  const std::vector<Access> s = StandardSchedule(3, 2);
  const std::vector<Access> want = {
      {0, Pass::kForward, 0},  {1, Pass::kForward, 0},  {2, Pass::kForward, 0},
      {2, Pass::kBackward, 0}, {1, Pass::kBackward, 0}, {0, Pass::kBackward, 0},
      {0, Pass::kForward, 1},  {1, Pass::kForward, 1},  {2, Pass::kForward, 1},
      {2, Pass::kBackward, 1}, {1, Pass::kBackward, 1}, {0, Pass::kBackward, 1}};
  EXPECT_EQ(s, want);
  auto same = BuildSchedule(3, {}, 2);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, want);
  const std::vector<ScheduleEntry> order = {
      {1, Pass::kForward}, {0, Pass::kForward}, {1, Pass::kBackward}, {0, Pass::kBackward}};
  auto declared = BuildSchedule(2, order, 3);
  ASSERT_TRUE(declared.ok());
  ASSERT_EQ(declared->size(), 12u);
  for (size_t i = 0; i < declared->size(); ++i) {
    EXPECT_EQ((*declared)[i], (Access{order[i % 4].block, order[i % 4].pass, int(i / 4)}));
  }
}

TEST(PlanScheduleTest, LayerMajorRunsEveryMicroBatchThroughAnAccessInTurn) {
  auto s = BuildSchedule(2, {}, 3, MicroBatchOrder::kLayerMajor);
  ASSERT_TRUE(s.ok());
  std::vector<Access> want;
  for (const Access& one : StandardSchedule(2, 1)) {
    for (int m = 0; m < 3; ++m) want.push_back({one.block, one.pass, m});
  }
  EXPECT_EQ(*s, want);
  // The device plan keeps a block's params across its micro-batches even at the smallest
  // budget: one load per block per pass at most, as with one micro-batch.
  const std::vector<uint64_t> pb = {1000, 3000}, gb = {1000, 3000};
  auto p = PlanDevice(*s, pb, gb, RoundUp(3000, 256) * 2);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  int loads = 0;
  for (const DevStep& d : p->steps) loads += d.load;
  EXPECT_LE(loads, 4);
  auto batch = PlanDevice(*BuildSchedule(2, {}, 3), pb, gb, RoundUp(3000, 256) * 2);
  ASSERT_TRUE(batch.ok());
  int batch_loads = 0;
  for (const DevStep& d : batch->steps) batch_loads += d.load;
  EXPECT_GT(batch_loads, loads);
}

TEST(PlanScheduleTest, BadOrdersAreRefusedNamingTheEntry) {
  using E = ScheduleEntry;
  const Pass F = Pass::kForward, B = Pass::kBackward;
  struct Case {
    std::vector<E> order;
    std::string want;
  } cases[] = {
      {{{0, F}, {2, F}, {0, B}}, "entry 1 (block 2, forward): the model has 2 blocks"},
      {{{0, F}, {0, F}}, "entry 1 (block 0, forward) repeats entry 0"},
      {{{0, B}, {0, F}}, "entry 0 (block 0, backward) comes before that block's forward"},
      {{{0, F}, {1, F}, {1, B}}, "no backward access of block 0"},
      {{{0, F}, {0, B}}, "no forward access of block 1"},
      {{{-1, F}}, "block -1"},
  };
  for (const Case& c : cases) {
    auto r = BuildSchedule(2, c.order, 1);
    ASSERT_FALSE(r.ok()) << c.want;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().message();
  }
}

// ---------------------------------------------------------------------------------------
// Device plan
// ---------------------------------------------------------------------------------------

TEST(PlanDeviceTest, UnlimitedLoadsEachBlockOnceAndATightBudgetStillFits) {
  const std::vector<Access> s = StandardSchedule(4, 1);
  const std::vector<uint64_t> pb = {1000, 3000, 500, 2000}, gb = {2000, 6000, 1000, 4000};
  auto all = PlanDevice(s, pb, gb, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(CheckDevicePlan(s, pb, gb, 0, *all), "");
  int loads = 0;
  for (const DevStep& st : all->steps) loads += st.load;
  EXPECT_EQ(loads, 4);
  // The largest backward (params + gradient buffer) is the least that works.
  const uint64_t least = RoundUp(3000, 256) + RoundUp(6000, 256);
  auto tight = PlanDevice(s, pb, gb, least);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  EXPECT_EQ(CheckDevicePlan(s, pb, gb, least, *tight), "");
  EXPECT_LE(tight->peak_bytes, least);
  auto refused = PlanDevice(s, pb, gb, least - 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(refused.status().message().find("backward of block 1"), std::string::npos)
      << refused.status().message();
}

TEST(PlanDeviceTest, RandomSchedulesAndBudgetsReplayCleanly) {
  const uint64_t seed = SeedFromEnv();
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (replay: STRATA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < TrialsFromEnv(2000) && !HasFailure(); ++trial) {
    const int L = 1 + int(rng() % 8);
    std::vector<uint64_t> pb(L), gb(L);
    uint64_t least = 0, total = 0;
    for (int b = 0; b < L; ++b) {
      pb[b] = 1 + rng() % 5000;
      gb[b] = rng() % 2 ? pb[b] : 2 * pb[b];
      least = std::max(least, RoundUp(pb[b], 256) + RoundUp(gb[b], 256));
      total += RoundUp(pb[b], 256) + RoundUp(gb[b], 256);
    }
    auto s = BuildSchedule(L, rng() % 2 ? RandomOrder(rng, L) : std::vector<ScheduleEntry>{},
                           1 + int(rng() % 3),
                           rng() % 2 ? MicroBatchOrder::kLayerMajor : MicroBatchOrder::kBatchMajor);
    ASSERT_TRUE(s.ok());
    const uint64_t cap = rng() % 4 == 0 ? 0 : least + rng() % (total - least + 1);
    auto p = PlanDevice(*s, pb, gb, cap);
    ASSERT_TRUE(p.ok()) << "trial " << trial << ": " << p.status().ToString();
    ASSERT_EQ(CheckDevicePlan(*s, pb, gb, cap, *p), "") << "trial " << trial;
  }
}

// ---------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------

// Over a matrix of seeds (models, schedules, budgets, world sizes, both collective
// memories): every rank plans the same collectives in the same order, and the order keeps
// its rules (checked in PlanAndCheck for the rank each case draws).
TEST(PlanCommTest, EveryRankPlansTheSameCollectivesInTheSameOrder) {
  const uint64_t seed = SeedFromEnv();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (replay: STRATA_TEST_SEED=" + std::to_string(seed) + ")");
  int cases = 0;
  for (int trial = 0; cases < TrialsFromEnv(300) && !HasFailure(); ++trial) {
    RandomCase c = MakeRandomCase(rng);
    if (c.options.world_size == 1) continue;
    ++cases;
    PlanOptions o = c.options;
    o.host_budget = uint64_t(1) << 50;
    auto roomy = PlanPlacement(c.layout, o);
    ASSERT_TRUE(roomy.ok()) << c.text << ": " << roomy.status().ToString();
    // The host minimum depends on the device budget (which params are copied again).
    o.device_budget = rng() % 2 ? 0 : roomy->report.device_min_bytes;
    roomy = PlanPlacement(c.layout, o);
    ASSERT_TRUE(roomy.ok()) << c.text << ": " << roomy.status().ToString();
    o.host_budget = rng() % 3 == 0 ? 0 : roomy->report.host_min_bytes + rng() % 65536;
    std::vector<CommItem> first;
    for (int rank = 0; rank < o.world_size; ++rank) {
      o.rank = rank;
      auto pp = PlanPlacement(c.layout, o);
      ASSERT_TRUE(pp.ok()) << c.text << ": " << pp.status().ToString();
      const std::vector<Access>* schedule = &pp->schedule;
      const DevicePlan* device = &pp->device;
      auto host = PlanHost(HostInputFor(*pp));
      ASSERT_TRUE(host.ok()) << c.text << ": " << host.status().ToString();
      CommSequenceOptions co;
      co.host_budget_unlimited = o.host_budget == 0;
      co.device_collectives = o.collectives == CollectiveMemory::kDevice;
      const std::vector<CommItem> seq = PlanCommSequence(*schedule, *device, *host, co);
      ASSERT_EQ(CheckCommSequence(*schedule, *device, *host, co, seq), "") << c.text;
      if (rank == 0) {
        first = seq;
      } else {
        ASSERT_EQ(seq, first) << c.text << ": rank " << rank << " differs from rank 0";
      }
    }
  }
}

}  // namespace
}  // namespace strata::engine_internal
