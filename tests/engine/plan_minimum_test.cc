// The host minimum the planner reports without a host budget (the all-on-host placement's,
// which `strata train` prints as "host budget unlimited (minimum ...)") is one that trains:
// given back as the host budget, with or without NVMe, under every schedule, order,
// micro-batch count, clipping mode and dtype, it plans (issue 45, round 4; before, with
// --nvme the placement then took the NVMe path, which could refuse it).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>

#include "engine/plan.h"
#include "tests/engine/plan_replay.h"

namespace strata::engine_internal {
namespace {

TEST(PlanMinimumTest, TheUnlimitedRunsReportedHostMinimumPlans) {
  const uint64_t seed = SeedFromEnv();
  const int trials = TrialsFromEnv(3000);
  int failures = 0;
  for (int trial = 0; trial < trials && failures < 5; ++trial) {
    std::mt19937_64 rng(seed ^ (uint64_t(trial) * 0x9E3779B97F4A7C15ull));
    RandomCase c = MakeRandomCase(rng);
    PlanOptions o = c.options;
    o.host_budget = 0;
    auto free_run = PlanPlacement(c.layout, o);
    if (!free_run.ok()) continue;  // e.g. durable without NVMe
    const uint64_t host_min = free_run->report.host_min_bytes;
    o.host_budget = host_min;
    auto at_min = PlanPlacement(c.layout, o);
    if (!at_min.ok()) {
      ++failures;
      ADD_FAILURE() << "seed " << seed << " trial " << trial << ": " << c.text
                    << ": the reported host minimum " << host_min
                    << " is refused: " << at_min.status().ToString();
    }
  }
}

}  // namespace
}  // namespace strata::engine_internal
