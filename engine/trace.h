// Timeline recording: the busy intervals and transferred bytes of every resource (for the
// step's busy table, lower bound, efficiency and per-edge bytes) and, optionally, a Chrome
// trace JSON file that Perfetto / chrome://tracing load, with one lane (thread) per resource
// and every operation as a complete ("X") event.
//
// Lanes: one per Resource (strata/engine.h: the same order and names), plus stall (compute
// idle while waiting for data) and step (one event per step). Operations that overlap on
// one resource (several NVMe reads in flight) go to numbered sub-lanes ("nvme_read #2") so
// every event stays visible.
//
// Thread safety: all methods may be called from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "strata/atomic_file.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::engine_internal {

using Clock = std::chrono::steady_clock;

// The first kNumResources lanes are the Resources, value for value; then the timeline's own.
enum class TraceLane : uint8_t {
  kNvmeRead = uint8_t(Resource::kNvmeRead),
  kNvmeWrite = uint8_t(Resource::kNvmeWrite),
  kH2D = uint8_t(Resource::kH2D),
  kD2H = uint8_t(Resource::kD2H),
  kCpuOptim = uint8_t(Resource::kCpuOptim),
  kCompute = uint8_t(Resource::kCompute),
  kComm = uint8_t(Resource::kComm),  // collectives (multi-rank)
  kStall = kNumResources,            // compute idle, waiting for data
  kStep,                             // one event per step
};
inline constexpr int kNumTraceLanes = kNumResources + 2;
constexpr TraceLane LaneOf(Resource r) { return TraceLane(uint8_t(r)); }
static_assert(int(TraceLane::kComm) == kNumResources - 1, "a Resource without a lane");
const char* TraceLaneName(TraceLane lane);

class Timeline {
 public:
  Timeline();
  ~Timeline();

  // Starts writing a trace to `path` (truncates it), its events under process `pid` named
  // `process_name`. IOError naming the path on failure.
  Status OpenTrace(const std::string& path, const std::string& process_name = "strata engine",
                   int pid = 1);
  // Whether operations from now on go to the trace file (the busy figures count them
  // either way); on by default.
  void SetTraceRecording(bool on);
  // Finishes the JSON (closing brackets) and closes the file. Safe to call twice.
  Status CloseTrace();

  // Records one finished operation; `bytes` counts toward the lane's bytes of the step.
  void Add(TraceLane lane, std::string_view label, Clock::time_point start, Clock::time_point end,
           uint64_t bytes = 0);

  // Starts collecting busy intervals and bytes for a new step (drops older ones).
  void BeginStep(Clock::time_point start);
  // The step's use of each resource within [from, to]: stats->busy_seconds (per Resource),
  // nvme_busy_seconds (reads and writes share the drives: the union of both), the busiest
  // of these as bound_seconds/bound_resource, and the per-edge bytes since BeginStep.
  void StepUsage(Clock::time_point from, Clock::time_point to, StepStats* stats) const;
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
  uint64_t bytes_[kNumTraceLanes] = {};  // since BeginStep
  std::unique_ptr<AtomicFile> out_;      // the trace file until CloseTrace renames it in place
  std::FILE* file_ = nullptr;            // out_'s stream
  std::string path_;
  bool first_event_ = true;
  bool recording_ = true;
  int pid_ = 1;
  // Per lane: end time of each sub-lane's last event (to place overlapping events).
  std::vector<Clock::time_point> slots_[kNumTraceLanes];
};

}  // namespace strata::engine_internal
