// Random models for the engine and planner tests: 1-3 tensors per block with odd shapes (1 to
// 4096 rows, 1 to 9 columns), each with or without weight decay.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "strata/engine.h"

namespace strata::engine_test {

inline std::vector<BlockSpec> RandomModel(std::mt19937_64& rng, int blocks) {
  static const int64_t kOdd[] = {1, 15, 17, 1023, 64, 4096, 3000};
  std::vector<BlockSpec> specs;
  for (int b = 0; b < blocks; ++b) {
    BlockSpec s;
    s.name = std::string("h.").append(std::to_string(b));
    const int tensors = 1 + int(rng() % 3);
    for (int t = 0; t < tensors; ++t) {
      TensorSpec ts;
      ts.name = std::string("w").append(std::to_string(t));
      const int64_t a = kOdd[rng() % 7];
      const int64_t c = 1 + int64_t(rng() % 9);
      ts.shape = {a, c};
      ts.weight_decay = (rng() % 2) == 0;
      s.tensors.push_back(ts);
    }
    specs.push_back(s);
  }
  return specs;
}

}  // namespace strata::engine_test
