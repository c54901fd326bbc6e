// `strata bench adam --state-dtype bf16,int8`: the AdamW kernel with compact moments against
// its own same-traffic bound (AdamTrafficStep over the same arrays), timed alternately in the
// same run, and checked against a scalar-kernel replay of a few whole blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/optim.h"
#include "strata/status.h"

namespace strata::cli {

struct CompactStateCase {
  size_t n = 0;
  CpuIsa isa = CpuIsa::kAuto;
  int threads = 0;
  StateFormat state = StateFormat::kBf16;  // kBf16 (stochastic) or kInt8
  FloatFormat grad_format = FloatFormat::kFp32;
  const void* grad = nullptr;  // n elements of grad_format, read only
  ParamOut out = ParamOut::kNone;
  uint16_t* out_buffer = nullptr;  // n elements when out != kNone
  int warmup = 2, iters = 10;
};

struct CompactStateResult {
  double seconds = 0, bound_seconds = 0;
  double ratio = 0;  // median of paired (bound time / kernel time)
  uint64_t wrong = 0;
};

// Allocates the master and the moments (and scales) for c.n parameters, runs warmup + iters
// paired steps, then replays the steps on the first and the last block with the scalar kernel.
// OutOfMemory naming the array when an allocation fails.
Result<CompactStateResult> RunCompactStateCase(const CompactStateCase& c);

}  // namespace strata::cli
