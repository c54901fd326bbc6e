// `strata bench adam --state-dtype bf16,int8 --master-dtype bf16-sr,bf16-kahan`: the AdamW kernel
// with compact moments or a 2-byte master against
// its own same-traffic bound (AdamTrafficStep over the same arrays), timed alternately in the
// same run, and checked against a scalar-kernel replay of a few whole blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "strata/optim.h"
#include "strata/status.h"

namespace strata::cli {

struct CompactStateCase {
  size_t n = 0;
  CpuIsa isa = CpuIsa::kAuto;
  int threads = 0;
  StateFormat state = StateFormat::kBf16;     // kFp32, kBf16 (stochastic) or kInt8 (nearest)
  MasterFormat master = MasterFormat::kFp32;  // a bf16 master: fp32/bf16 grads, no fp16 copy
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

// The hyper-parameters of step t of every bench adam case: AdamW, lr 1e-3, weight decay 0.01.
AdamHyperParams BenchHyper(int64_t t);

// Paired timing: warmup + iters rounds, round k running kernel(t) and bound(t) (t = 1, 2, ...)
// once each, in alternating order so neither side always runs after the other; the medians
// over the timed rounds. The first error of either is returned.
struct PairedTimes {
  double kernel_seconds = 0, bound_seconds = 0;
  double ratio = 0;   // median of (bound time / kernel time), round by round
  int64_t steps = 0;  // the last t passed to kernel
};
Result<PairedTimes> TimeAgainstBound(int warmup, int iters,
                                     const std::function<Status(int64_t)>& kernel,
                                     const std::function<Status(int64_t)>& bound);

// Allocates the master and the moments (and scales) for c.n parameters, runs warmup + iters
// paired steps, then replays the steps on the first and the last block with the scalar kernel.
// OutOfMemory naming the array when an allocation fails.
Result<CompactStateResult> RunCompactStateCase(const CompactStateCase& c);

}  // namespace strata::cli
