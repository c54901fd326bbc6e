// The engine tests' fake model: deterministic initial values, and one micro-batch of
// forward + backward whose gradient is a fixed function of the params, the step and the
// micro-batch. The single-rank and the multi-rank tests drive exactly this model, so their
// results are comparable.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

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

// The fake gradient of element k: 0.3 p + a small step/micro-batch dependent term.
inline float FakeGrad(const BlockView& v, uint64_t k, int64_t step, int m) {
  return 0.3f * Param(v, k) + float(int((k * 7 + uint64_t(step) * 13 + m * 5) % 17) - 8) * 0.01f;
}

// How the backward writes the GradBuffer (tests of EngineOptions::grad_dtype across ranks).
struct FakeGradWrite {
  // >= 0: rank `rank`'s gradient, RankGrad: the ranks' gradients differ.
  int rank = -1;
  // kBf16: packed as the models pack it (padded_numel bf16 values, nearest even, at the start
  // of the buffer), for an engine with GradDtype::kBf16.
  GradDtype dtype = GradDtype::kFp32;
  // With rank >= 0 and dtype kFp32: each value rounded to bf16 and written as fp32 (the
  // rounding of kBf16 done by the model instead of the engine).
  bool round_to_bf16 = false;
  // > 0 (rank -1, dtype kFp32): the average of RankGrad rounded to bf16 over ranks 0..n-1,
  // summed in rank order in fp32 and divided by n, as the engine's reduce-scatter averages
  // what n ranks with bf16 gradients land.
  int average_bf16_of_ranks = 0;
};

// Rank r's gradient of element k: FakeGrad scaled and shifted by the rank.
inline float RankGrad(const BlockView& v, uint64_t k, int64_t step, int m, int r) {
  return FakeGrad(v, k, step, m) * (1.0f + 0.25f * float(r)) + 0.003f * float(r);
}

inline float RoundToBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

// Element k of the gradient `how` asks for.
inline float FakeGradAs(const BlockView& v, uint64_t k, int64_t step, int m,
                        const FakeGradWrite& how) {
  if (how.average_bf16_of_ranks > 0) {
    float sum = 0;
    for (int r = 0; r < how.average_bf16_of_ranks; ++r) {
      sum += RoundToBf16(RankGrad(v, k, step, m, r));
    }
    return sum / float(how.average_bf16_of_ranks);
  }
  if (how.rank < 0) return FakeGrad(v, k, step, m);
  const float g = RankGrad(v, k, step, m, how.rank);
  return how.round_to_bf16 ? RoundToBf16(g) : g;
}

// The backward's gradient in memory the model owns, handed over with SubmitGradsFrom (as the
// Python layer hands torch's tensors) instead of written into the GradBuffer. Each submission's
// memory is held until the engine says it has read it, then filled with NaN before it is
// freed, so a read after GradsRead() would show in the results.
struct CallerGrads {
  std::deque<std::pair<uint64_t, std::vector<std::vector<float>>>> held;
  uint64_t max_held = 0;  // the most submissions held at once

  void DropRead(const Engine& e) {
    while (!held.empty() && held.front().first <= e.GradsRead()) {
      for (auto& t : held.front().second) std::fill(t.begin(), t.end(), std::nanf(""));
      held.pop_front();
    }
  }
};

// Micro-batch m of `step`: forward reads every tensor on the compute lane; backward writes
// FakeGrad and hands it to the engine, through the GradBuffer or, given `caller`, from the
// model's own memory. With `zero_last` the block's last tensor gets a zero gradient (from
// the caller: a null pointer). The forward begins at `first_block` (the caller acquired and
// released the blocks before it).
inline Status RunFakeMicroBatch(Engine& e, Device& d, int64_t step, int m,
                                CallerGrads* caller = nullptr, bool zero_last = false,
                                int first_block = 0, const FakeGradWrite& how = {}) {
  const int L = int(e.Layout().size());
  for (int b = first_block; b < L; ++b) {
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
    const size_t n = v.layout->tensors.size();
    if (caller == nullptr) {
      STRATA_ASSIGN_OR_RETURN(float* g, e.GradBuffer(b));
      STRATA_RETURN_IF_ERROR(d.EnqueueHostFunction(
          Lane::kCompute,
          [v, g, step, m, n, zero_last, how] {
            for (size_t ti = 0; ti < n; ++ti) {
              const TensorLayout& t = v.layout->tensors[ti];
              for (uint64_t i = 0; i < t.numel; ++i) {
                const uint64_t k = t.offset + i;
                g[k] = zero_last && ti + 1 == n ? 0.f : FakeGradAs(v, k, step, m, how);
              }
            }
            if (how.dtype == GradDtype::kBf16) {
              // In place, ascending: bf16 value i lands in float i/2's bytes, already read.
              for (uint64_t i = 0; i < v.layout->padded_numel; ++i) {
                const uint16_t h = FloatToBf16(g[i]);
                std::memcpy(reinterpret_cast<char*>(g) + 2 * i, &h, 2);
              }
            }
            return Status::OK();
          },
          "backward"));
      STRATA_RETURN_IF_ERROR(e.SubmitGrads(b));
    } else {
      std::vector<std::vector<float>> mine(n);
      std::vector<const float*> ptrs(n, nullptr);
      for (size_t ti = 0; ti < n; ++ti) {
        if (zero_last && ti + 1 == n) continue;
        mine[ti].assign(v.layout->tensors[ti].numel, std::nanf(""));
        ptrs[ti] = mine[ti].data();
      }
      std::vector<float*> out(n);
      for (size_t ti = 0; ti < n; ++ti) out[ti] = mine[ti].data();
      STRATA_RETURN_IF_ERROR(d.EnqueueHostFunction(
          Lane::kCompute,
          [v, out, step, m] {
            for (size_t ti = 0; ti < out.size(); ++ti) {
              const TensorLayout& t = v.layout->tensors[ti];
              if (out[ti] == nullptr) continue;
              for (uint64_t i = 0; i < t.numel; ++i)
                out[ti][i] = FakeGrad(v, t.offset + i, step, m);
            }
            return Status::OK();
          },
          "backward"));
      STRATA_ASSIGN_OR_RETURN(uint64_t ticket, e.SubmitGradsFrom(b, ptrs));
      caller->held.emplace_back(ticket, std::move(mine));
      caller->max_held = std::max<uint64_t>(caller->max_held, caller->held.size());
      caller->DropRead(e);
    }
    STRATA_RETURN_IF_ERROR(e.Release(b));
  }
  return Status::OK();
}

}  // namespace strata::testing
