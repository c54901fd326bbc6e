// Timeline recording: the busy intervals of every resource (for the step's lower bound and
// efficiency) and, optionally, a Chrome trace JSON file that Perfetto / chrome://tracing
// load, with one lane (thread) per resource and every operation as a complete ("X") event.
//
// Lanes: nvme_read, nvme_write, h2d, d2h, cpu_optim, compute, comm (the Resource enum), plus
// stall (compute idle while waiting for data) and step (one event per step). Operations
// that overlap on one resource (several NVMe reads in flight) go to numbered sub-lanes
// ("nvme_read #2") so every event stays visible.
//
// Thread safety: all methods may be called from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "strata/engine.h"
#include "strata/status.h"

namespace strata::engine_internal {

using Clock = std::chrono::steady_clock;

enum class TraceLane : uint8_t {
  kNvmeRead,
  kNvmeWrite,
  kH2D,
  kD2H,
  kCpuOptim,
  kCompute,
  kStall,
  kStep,
  kComm  // collectives (multi-rank)
};
inline constexpr int kNumTraceLanes = 9;
const char* TraceLaneName(TraceLane lane);

class Timeline {
 public:
  Timeline();
  ~Timeline();

  // Starts writing a trace to `path` (truncates it). IOError naming the path on failure.
  Status OpenTrace(const std::string& path);
  // Finishes the JSON (closing brackets) and closes the file. Safe to call twice.
  Status CloseTrace();

  // Records one finished operation.
  void Add(TraceLane lane, std::string_view label, Clock::time_point start, Clock::time_point end,
           uint64_t bytes = 0);

  // Starts collecting busy intervals for a new step (drops older ones).
  void BeginStep(Clock::time_point start);
  // Busy seconds of `lane` within [from, to]: the length of the union of its intervals.
  double BusySeconds(TraceLane lane, Clock::time_point from, Clock::time_point to) const;
  // Busy seconds of the union of two lanes (reads and writes sharing the same drives).
  double BusySeconds2(TraceLane a, TraceLane b, Clock::time_point from, Clock::time_point to) const;
  // Seconds within [from, last end of a compute op before `to`] when no compute op ran.
  double ComputeIdleSeconds(Clock::time_point from, Clock::time_point to,
                            Clock::time_point* last_compute_end) const;
  // Adds stall events for the compute lane's idle gaps in [from, to] (trace only).
  void AddStallEvents(Clock::time_point from, Clock::time_point to);

 private:
  struct Interval {
    Clock::time_point start, end;
  };
  std::vector<Interval> MergedLocked(TraceLane lane, Clock::time_point from,
                                     Clock::time_point to) const;
  void WriteEventLocked(TraceLane lane, std::string_view label, Clock::time_point start,
                        Clock::time_point end, uint64_t bytes);

  const Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Interval> intervals_[kNumTraceLanes];
  std::FILE* file_ = nullptr;
  std::string path_;
  bool first_event_ = true;
  // Per lane: end time of each sub-lane's last event (to place overlapping events).
  std::vector<Clock::time_point> slots_[kNumTraceLanes];
};

}  // namespace strata::engine_internal
