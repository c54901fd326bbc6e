// Statistics the benchmarks share (`strata bench model`, `strata bench adam` with its
// compact-state cases, `strata bench io`, bench/gpu_model_bench): kept here, in the one module
// both tools/ and bench/ may include.
//
// Header-only, stateless; safe from any thread.
#pragma once

#include <algorithm>
#include <vector>

namespace strata::model {

// The median of `v`: the middle value, or the mean of the two middle values for an even
// count; 0 for an empty vector. Takes a copy: the caller's order is kept.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace strata::model
