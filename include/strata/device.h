// Device: where a model's compute runs and what the swap scheduler copies to and from.
//
// Two implementations: HostDevice, a "device" in host RAM with a hard byte budget whose
// copies run on a copy worker (so they overlap with compute like DMA engines) and whose
// compute runs on the CPU; and CudaDevice, a CUDA GPU with a memory pool inside the budget
// and separate streams for H2D copies, D2H copies, compute and collectives.
//
// Work is ordered per Lane (a CUDA stream; a worker thread on HostDevice): operations on one
// lane run in submission order; operations on different lanes run concurrently, and their
// dependencies are expressed with events (Record on one lane, WaitEvent on another), never
// with device-wide synchronisation.
//
// Errors in enqueued work are stored and returned by the next Synchronize/Query on an event
// recorded after it on that lane, and by Error(); they are never dropped. The first failure
// on a lane is that lane's error (sticky): SynchronizeLane keeps returning it. The Enqueue*/
// Copy* calls themselves fail only for bad arguments (InvalidArgument) or a device that is
// shutting down; a stored background error does not make them fail.
//
// After a failure HostDevice skips every later operation of that lane, and a WaitEvent on an
// event that completed with an error fails the waiting lane too. CudaDevice skips later host
// functions of the failed lane but cannot un-launch copies and kernels already on the
// stream; rely on the returned Status, not on partial results.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

enum class DeviceKind : uint8_t { kHost, kCuda };

// An ordered queue of device work. kCompute: kernels (or CPU compute on HostDevice);
// kH2D / kD2H: copies; kComm: collectives.
enum class Lane : uint8_t { kCompute = 0, kH2D = 1, kD2H = 2, kComm = 3 };
inline constexpr int kNumLanes = 4;
inline const char* LaneName(Lane lane) {
  switch (lane) {
    case Lane::kCompute:
      return "compute";
    case Lane::kH2D:
      return "h2d";
    case Lane::kD2H:
      return "d2h";
    case Lane::kComm:
      return "comm";
  }
  return "?";
}

// A point in a lane's queue. Complete once all work enqueued on that lane before it is done.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // True when complete; a failed operation before it makes this return true as well
  // (Synchronize then returns the failure).
  virtual bool Query() = 0;
  // Blocks the calling thread until complete; returns the first error of the work before it.
  virtual Status Synchronize() = 0;
};
using EventPtr = std::shared_ptr<DeviceEvent>;

struct DeviceMemoryStats {
  uint64_t budget_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;  // since creation or the last ResetPeak()
};

// One finished device operation, as reported to the observer (for statistics and traces).
struct DeviceOpRecord {
  Lane lane;
  std::string_view label;  // what the caller named it ("h2d block 3")
  std::chrono::steady_clock::time_point start, end;
  uint64_t bytes = 0;  // copies: bytes moved; 0 otherwise
  bool ok = true;      // false for the operation that failed (and set the lane's error)
};

struct DeviceOptions {
  uint64_t memory_budget_bytes = 0;  // hard cap on Allocate; 0 = all the device has
  int cuda_device = 0;               // CUDA ordinal (CudaDevice only)
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind Kind() const = 0;
  virtual std::string Name() const = 0;  // "host", "cuda:0 NVIDIA H200"

  // Allocates `bytes` of device memory, 256-byte aligned. OutOfMemory (naming the budget,
  // the bytes in use and the request) when the budget would be exceeded. Accounting counts
  // the bytes requested, so a budget of N bytes admits one allocation of N bytes. Zero bytes
  // returns a distinct non-null pointer that must be freed (and counts as 0 bytes).
  virtual Result<void*> Allocate(size_t bytes) = 0;
  // Frees memory from Allocate. The caller ensures no enqueued work still uses it
  // (e.g. by synchronising an event recorded after that work).
  virtual Status Free(void* ptr) = 0;
  virtual DeviceMemoryStats MemoryStats() const = 0;
  virtual void ResetPeak() = 0;

  // Makes [ptr, ptr+bytes) of host memory usable for fast asynchronous copies
  // (cudaHostRegister on CUDA; no-op on HostDevice). The pinned pool calls this once.
  virtual Status RegisterHostMemory(void* ptr, size_t bytes) = 0;
  virtual Status UnregisterHostMemory(void* ptr) = 0;

  // Lets the device side of copies lie in [ptr, ptr+bytes), memory this device did not
  // allocate: a framework's own tensors (torch's CUDA allocator; on HostDevice, ordinary host
  // memory standing in for device memory). Not counted in the budget. CUDA checks that it is
  // device memory of this GPU (InvalidArgument otherwise). Until ForgetMemory(ptr), which the
  // caller calls once no enqueued copy uses it (it makes no CUDA call, so a host function may);
  // adopting the same ptr twice needs two forgets.
  virtual Status AdoptMemory(const void* ptr, size_t bytes) = 0;
  virtual Status ForgetMemory(const void* ptr) = 0;

  // Asynchronous copies on the kH2D / kD2H lanes (or `lane` when given). The host side must
  // stay valid until the copy completes; registered host memory is fastest (CUDA: a copy
  // from or to unregistered memory may block the caller until the stream reaches it, and
  // does not overlap like a DMA transfer). The device side must lie inside one live
  // allocation of this device or one adopted range (InvalidArgument otherwise).
  virtual Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                              std::string_view label, Lane lane = Lane::kH2D) = 0;
  virtual Status CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                            std::string_view label, Lane lane = Lane::kD2H) = 0;

  // Runs `fn` on the CPU in order with `lane`'s other work (HostDevice: on the lane's
  // worker; CUDA: a host function on the lane's stream). A non-OK return (or an exception,
  // as Aborted) is stored as the lane's error. On HostDevice this is how compute runs on the
  // compute lane. CUDA: `fn` must not call CUDA, and host functions of all lanes may run on
  // one driver thread, so keep them short (long CPU work belongs on the caller's threads).
  virtual Status EnqueueHostFunction(Lane lane, std::function<Status()> fn,
                                     std::string_view label) = 0;

  // Occupies `lane` for `duration` without using host CPU (HostDevice: the worker sleeps;
  // CUDA: a clock-spinning kernel). Emulates a kernel of known duration for benchmarks.
  virtual Status EnqueueBusy(Lane lane, std::chrono::nanoseconds duration,
                             std::string_view label) = 0;

  // Records an event at the current end of `lane`'s queue.
  virtual Result<EventPtr> Record(Lane lane) = 0;
  // Makes later work on `lane` wait until `event` completes (no host blocking).
  virtual Status WaitEvent(Lane lane, const EventPtr& event) = 0;
  // Blocks until everything enqueued on `lane` so far is done; returns the lane's error.
  virtual Status SynchronizeLane(Lane lane) = 0;

  // The first error stored by background work, or OK.
  virtual Status Error() const = 0;

  // Native stream handle of a lane (cudaStream_t on CUDA, nullptr on HostDevice), for model
  // code that launches its own kernels.
  virtual void* NativeStream(Lane lane) = 0;

  // Receives every finished copy, host function and busy operation (Record/WaitEvent are
  // not reported; operations skipped after a lane's failure are not reported; the failing one
  // is, with ok = false). Called from worker threads; must be cheap, thread-safe and must not
  // call back into the device. All records of a lane's operations enqueued before a
  // SynchronizeLane(lane) have been delivered when it returns. nullptr removes it.
  // CudaDevice: copy/busy timestamps come from CUDA timing events mapped onto steady_clock
  // (microsecond-level accuracy); host function timestamps are exact.
  virtual void SetObserver(std::function<void(const DeviceOpRecord&)> observer) = 0;
};

// A HostDevice with `options.memory_budget_bytes` (0 = unlimited).
Result<std::unique_ptr<Device>> CreateHostDevice(const DeviceOptions& options);
// A CudaDevice; NotSupported ("built without CUDA" / "no CUDA device present") when none.
Result<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options);
// True when this build has CUDA and a CUDA device is present.
bool CudaAvailable();

}  // namespace strata
