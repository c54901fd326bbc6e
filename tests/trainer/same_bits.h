// What two training runs must agree on bit for bit (losses, gradient norms, every block's
// master weights and moments), and the comparison: shared by the tests that run one model
// in two orders or on two memory plans (micro_batch_order_test, train_cuda_test).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "strata/engine.h"

namespace strata::model {

struct RunBits {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> states;  // every block's master, exp_avg, exp_avg_sq
};

// Appends every block's master, exp_avg and exp_avg_sq (this rank's shards) to bits->states.
inline void ReadStates(const Engine& e, RunBits* bits) {
  for (int b = 0; b < int(e.Layout().size()); ++b) {
    for (Component comp : {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq}) {
      std::vector<float> v(e.Layout()[b].shard_numel);
      EXPECT_TRUE(e.ReadComponent(b, comp, v).ok());
      bits->states.push_back(std::move(v));
    }
  }
}

inline void ExpectSameBits(const RunBits& a, const RunBits& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  ASSERT_EQ(a.norms.size(), b.norms.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0)
        << what << ": step " << i + 1 << " loss " << a.losses[i] << " vs " << b.losses[i];
  }
  for (size_t i = 0; i < a.norms.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.norms[i], &b.norms[i], sizeof(double)), 0)
        << what << ": step " << i + 1 << " grad norm " << a.norms[i] << " vs " << b.norms[i];
  }
  ASSERT_EQ(a.states.size(), b.states.size()) << what;
  for (size_t i = 0; i < a.states.size(); ++i) {
    ASSERT_EQ(a.states[i].size(), b.states[i].size()) << what;
    EXPECT_EQ(std::memcmp(a.states[i].data(), b.states[i].data(), a.states[i].size() * 4), 0)
        << what << ": block " << i / 3 << " component " << i % 3 << " differs";
  }
}

}  // namespace strata::model
