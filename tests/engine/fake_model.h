// The engine tests' fake model: deterministic initial values, and one micro-batch of
// forward + backward whose gradient is a fixed function of the params, the step and the
// micro-batch. The single-rank and the multi-rank tests drive exactly this model, so their
// results are comparable.
#pragma once

#include <cmath>
#include <cstdint>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/optim.h"
#include "strata/status.h"

namespace strata::testing {

inline float InitValue(int block, int tensor, size_t i) {
  return float(std::sin(double(block * 131 + tensor * 17) + double(i) * 0.37)) * 0.5f;
}

// Element k of the block's working params, as float.
inline float Param(const BlockView& v, uint64_t k) {
  if (v.dtype == WorkingDtype::kBf16) return Bf16ToFloat(static_cast<const uint16_t*>(v.params)[k]);
  return static_cast<const float*>(v.params)[k];
}

// Micro-batch m of `step`: forward reads every tensor on the compute lane; backward writes
// g = 0.3 p + a small step/micro-batch dependent term, and hands it to the engine.
inline Status RunFakeMicroBatch(Engine& e, Device& d, int64_t step, int m) {
  const int L = int(e.Layout().size());
  for (int b = 0; b < L; ++b) {
    STRATA_ASSIGN_OR_RETURN(BlockView v, e.Acquire(b, Pass::kForward));
    STRATA_RETURN_IF_ERROR(d.EnqueueHostFunction(
        Lane::kCompute,
        [v] {
          volatile float s = 0;
          for (const TensorLayout& t : v.layout->tensors) s = s + Param(v, t.offset + t.numel - 1);
          return Status::OK();
        },
        "forward"));
    STRATA_RETURN_IF_ERROR(e.Release(b));
  }
  for (int b = L - 1; b >= 0; --b) {
    STRATA_ASSIGN_OR_RETURN(BlockView v, e.Acquire(b, Pass::kBackward));
    STRATA_ASSIGN_OR_RETURN(float* g, e.GradBuffer(b));
    STRATA_RETURN_IF_ERROR(d.EnqueueHostFunction(
        Lane::kCompute,
        [v, g, step, m] {
          for (const TensorLayout& t : v.layout->tensors) {
            for (uint64_t i = 0; i < t.numel; ++i) {
              const uint64_t k = t.offset + i;
              g[k] = 0.3f * Param(v, k) +
                     float(int((k * 7 + uint64_t(step) * 13 + m * 5) % 17) - 8) * 0.01f;
            }
          }
          return Status::OK();
        },
        "backward"));
    STRATA_RETURN_IF_ERROR(e.SubmitGrads(b));
    STRATA_RETURN_IF_ERROR(e.Release(b));
  }
  return Status::OK();
}

}  // namespace strata::testing
