// HostDevice: a Device whose "device memory" is host RAM under a hard byte budget, whose
// copies run on per-lane worker threads (so they overlap with compute the way DMA engines
// overlap with kernels) and whose compute runs on the CPU. It lets every engine path run and
// be tested without a GPU.
//
// Structure: one worker thread per Lane, each draining a FIFO queue of operations
// (copy = memcpy, host function, busy = sleep, record = complete an event, wait = block on
// another event). Workers block on condition variables; nothing spins. An event recorded on
// an idle lane (queue empty, worker not running) completes at once, and a wait for an event
// already completed without error queues nothing: the caller needs no hand-off to a worker.
//
// Errors: the first failing operation of a lane becomes that lane's error. Every later
// operation on that lane is skipped (not run, not reported to the observer), and events
// recorded after it complete with that error. A WaitEvent on an event that completed with an
// error fails the waiting lane as well, so work never runs on data whose producer failed.
// Error() returns the first error of any lane.
//
// Memory: Allocate returns 256-byte-aligned blocks from aligned_alloc. Accounting counts the
// bytes requested (not the rounded-up size), so a budget of exactly N bytes admits an
// allocation of N bytes. Like the CUDA device's memory pool, Free keeps the block for reuse:
// a later Allocate of the same rounded size gets it back, its pages already mapped. Without
// this every per-access buffer of the engine was a fresh mmap whose first write page-faulted
// (at GPT-2-small geometry, copies into them ran at half speed). The kept blocks are not
// "in use" and not counted against the budget; they total at most the high-water mark of
// live blocks, and an allocation that fails gives them back to the OS and retries. Their
// contents are whatever the last user left (as on a GPU). Copies check that their device side lies
// inside one live allocation of this device (InvalidArgument otherwise): it catches host/device
// mix-ups in engine code that a real GPU would report as an illegal address much later.
//
// Ownership: the HostDevice owns its workers and its allocations; the destructor finishes
// all enqueued work, joins the workers and frees what is still allocated.
//
// Thread safety: all methods may be called from any thread concurrently.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gpu/device_util.h"
#include "strata/device.h"

namespace strata {

class HostEvent;

class HostDevice final : public Device {
 public:
  explicit HostDevice(const DeviceOptions& options);
  ~HostDevice() override;
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  DeviceKind Kind() const override { return DeviceKind::kHost; }
  std::string Name() const override { return "host"; }

  Result<void*> Allocate(size_t bytes) override;
  Status Free(void* ptr) override;
  DeviceMemoryStats MemoryStats() const override;
  void ResetPeak() override;

  Status RegisterHostMemory(void* ptr, size_t bytes) override;
  Status UnregisterHostMemory(void* ptr) override;
  Status AdoptMemory(const void* ptr, size_t bytes) override;
  Status ForgetMemory(const void* ptr) override;

  Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes, std::string_view label,
                      Lane lane = Lane::kH2D) override;
  Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, std::string_view label,
                    Lane lane = Lane::kD2H) override;
  Status EnqueueHostFunction(Lane lane, std::function<Status()> fn,
                             std::string_view label) override;
  Status EnqueueBusy(Lane lane, std::chrono::nanoseconds duration, std::string_view label) override;

  Result<EventPtr> Record(Lane lane) override;
  Status WaitEvent(Lane lane, const EventPtr& event) override;
  Status SynchronizeLane(Lane lane) override;
  Status Error() const override;

  void* NativeStream(Lane) override { return nullptr; }
  void SetObserver(std::function<void(const DeviceOpRecord&)> observer) override;

 private:
  struct Op {
    enum class Kind : uint8_t { kCopy, kHostFunction, kBusy, kRecord, kWait };
    Kind kind = Kind::kCopy;
    std::string label;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    std::function<Status()> fn;
    std::chrono::nanoseconds duration{0};
    std::shared_ptr<HostEvent> record;  // kRecord: the event to complete
    EventPtr wait;                      // kWait: the event to wait for
  };

  struct LaneState {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Op> queue;
    bool stop = false;
    // The worker is running an operation it took off the queue (under mu). A lane whose queue
    // is empty and whose worker is not running is idle: everything enqueued has run.
    bool running = false;
    // The lane's first error: written only by its worker while running; read by it, and by
    // Record under mu while the lane is idle.
    Status error;
    std::thread worker;
  };

  // Checks that [ptr, ptr+bytes) lies inside one live allocation (any range when bytes == 0).
  Status CheckDeviceRange(const void* ptr, size_t bytes, std::string_view what) const;
  Status Enqueue(Lane lane, Op op);
  void WorkerLoop(Lane lane);
  // Runs one operation on `lane`'s worker; returns its status (OK for skipped ones).
  void RunOp(Lane lane, LaneState& state, Op& op);
  void SetError(Lane lane, LaneState& state, Status status);

  const uint64_t budget_bytes_;  // 0 = unlimited

  // Returns every kept block to the OS. REQUIRES: mem_mu_ held.
  void ReleaseCachedLocked();

  mutable std::mutex mem_mu_;
  std::map<uintptr_t, size_t> allocations_;  // start address -> bytes requested
  gpu_internal::AdoptedRanges adopted_;
  uint64_t in_use_bytes_ = 0;
  uint64_t peak_bytes_ = 0;
  // Rounded sizes of the live blocks, and their largest total ever (ResetPeak leaves it).
  uint64_t live_rounded_bytes_ = 0;
  uint64_t high_water_rounded_bytes_ = 0;
  // Freed blocks kept for reuse: rounded size -> block; cached_bytes_ is their rounded total.
  std::multimap<size_t, void*> cached_;
  uint64_t cached_bytes_ = 0;

  mutable std::mutex error_mu_;
  Status first_error_;

  mutable std::mutex observer_mu_;
  std::shared_ptr<const std::function<void(const DeviceOpRecord&)>> observer_;

  LaneState lanes_[kNumLanes];
};

}  // namespace strata
