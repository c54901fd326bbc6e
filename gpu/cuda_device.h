// CudaDevice: a Device on one CUDA GPU. Internal header: includes the CUDA runtime API, so
// only files compiled in a CUDA build (STRATA_HAVE_CUDA) may include it.
//
// Memory: a private stream-ordered memory pool (cudaMemPoolCreate) whose release threshold
// keeps freed memory cached, so steady-state Allocate/Free never reach the driver and never
// synchronise the device (unlike cudaFree). The byte budget is enforced by this class's own
// accounting of requested bytes, not by the GPU's size; budget 0 means "what the GPU has",
// and MemoryStats then reports the GPU's total memory as the budget.
//
// Lanes: one non-blocking stream per Lane. Copy and comm streams get the highest priority so
// that a transfer is not starved by a long compute queue; compute gets the lowest.
//
// Events: cudaEvent (timing disabled, blocking sync so waiting threads sleep instead of
// spinning). Record = cudaEventRecord, WaitEvent = cudaStreamWaitEvent: dependencies never
// block the host and never synchronise the whole device.
//
// Errors: every CUDA call is checked and turned into Status::Cuda naming the call and
// cudaGetErrorString. Each lane keeps a sequence number per enqueued operation; the first
// failure (a host function returning non-OK, a failed launch, an asynchronous CUDA error
// seen while synchronising) is stored with its sequence number, so an event reports exactly
// the failures that precede it on its lane. After a lane failed, later host functions on it
// are skipped and later enqueues on it are dropped (not launched, not reported); work that
// was already on the stream still runs.
//
// Observer: copies and busy kernels are bracketed with timing events when an observer is
// set; a collector thread per lane waits for them (blocking, in submission order), maps GPU
// times onto
// steady_clock through an anchor event taken at creation (microsecond accuracy; float
// milliseconds lose precision after hours, ~0.25 ms after one) and calls the observer.
// SynchronizeLane also waits until that lane's records are delivered. Host functions are
// timed on the host in the CUDA callback thread.
//
// Host functions run on CUDA's callback thread; they must not call CUDA APIs, and the
// callbacks of all lanes may be serialised, so long CPU work (the optimizer) belongs on the
// engine's own threads, not in EnqueueHostFunction.
//
// Ownership: owns its streams, pool, events it creates and the collector threads. The
// destructor waits for each lane's stream (not the device), then frees everything.
// Thread safety: all methods may be called from any thread; each method makes this GPU
// current for its duration and restores the caller's current device.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "gpu/device_util.h"
#include "strata/device.h"

namespace strata {

// Status::Cuda for a failed call: "<call>: <cudaGetErrorString> (<cudaGetErrorName>)".
Status CudaStatus(cudaError_t err, std::string_view call);

// Makes `ordinal` the calling thread's current device for a scope and restores the caller's
// afterwards, so that model code using several GPUs is not surprised (CudaDevice, the NCCL
// communicator). status(): cudaSetDevice's result.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != ordinal) {
      status_ = cudaSetDevice(ordinal);
    } else {
      previous_ = -1;  // nothing to restore
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Per-lane failure bookkeeping, shared with the events (which may outlive the device).
struct CudaErrorState {
  std::mutex mu;
  Status first_error;  // of the whole device
  struct PerLane {
    uint64_t error_seq = UINT64_MAX;  // sequence number of the first failed op
    Status error;
  } lanes[kNumLanes];

  // Stores `status` as lane's error unless an earlier one is stored.
  void Fail(Lane lane, uint64_t seq, Status status);
  // The lane's error if it failed at or before `seq`, else OK.
  Status ErrorAtOrBefore(Lane lane, uint64_t seq);
  bool Failed(Lane lane);
};

// A CudaDevice event: a point in one lane's stream.
class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(int ordinal, cudaEvent_t event, Lane lane, uint64_t seq,
            std::shared_ptr<CudaErrorState> errors)
      : ordinal_(ordinal), event_(event), lane_(lane), seq_(seq), errors_(std::move(errors)) {}
  ~CudaEvent() override;
  bool Query() override;
  Status Synchronize() override;
  cudaEvent_t native() const { return event_; }
  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
  const cudaEvent_t event_;
  const Lane lane_;
  const uint64_t seq_;  // the lane's sequence number when recorded
  std::shared_ptr<CudaErrorState> errors_;
};

class CudaDevice final : public Device {
 public:
  // NotSupported when no CUDA device is present; InvalidArgument when options.cuda_device
  // is not an ordinal of this machine; Cuda when setting up streams or the pool fails.
  static Result<std::unique_ptr<CudaDevice>> Create(const DeviceOptions& options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceKind Kind() const override { return DeviceKind::kCuda; }
  std::string Name() const override { return name_; }
  int ordinal() const { return ordinal_; }

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

  void* NativeStream(Lane lane) override;
  cudaStream_t stream(Lane lane) const { return streams_[static_cast<int>(lane)]; }
  void SetObserver(std::function<void(const DeviceOpRecord&)> observer) override;

 private:
  using Observer = std::function<void(const DeviceOpRecord&)>;
  struct HostFnCall;
  struct Collector;
  struct Pending {  // an observed op waiting for its timing events
    Lane lane;
    std::string label;
    uint64_t bytes;
    cudaEvent_t start, end;
    std::shared_ptr<const Observer> observer;
  };

  explicit CudaDevice(int ordinal);
  Status Init(const DeviceOptions& options);
  Status CheckDeviceRange(const void* ptr, size_t bytes, std::string_view what) const;
  // Enqueues one observed-or-not GPU operation on `lane`; `launch` issues it on the stream.
  Status EnqueueGpuOp(Lane lane, std::string_view label, uint64_t bytes,
                      const std::function<cudaError_t(cudaStream_t)>& launch,
                      std::string_view call);
  std::shared_ptr<const Observer> CurrentObserver();
  void CollectorLoop(Collector& c);
  static void HostFnTrampoline(void* arg);

  const int ordinal_;
  std::string name_;
  uint64_t budget_bytes_ = 0;  // 0 = the GPU's size (no accounting limit)
  uint64_t reported_budget_ = 0;

  cudaMemPool_t pool_ = nullptr;
  cudaStream_t alloc_stream_ = nullptr;
  cudaStream_t streams_[kNumLanes] = {};
  cudaEvent_t anchor_ = nullptr;
  std::chrono::steady_clock::time_point anchor_time_;

  mutable std::mutex mem_mu_;
  std::map<uintptr_t, size_t> allocations_;
  gpu_internal::AdoptedRanges adopted_;  // AdoptMemory: torch's tensors, say
  uint64_t in_use_bytes_ = 0;
  uint64_t peak_bytes_ = 0;

  // Enqueue order per lane == stream order: the lane mutex is held across the CUDA call.
  struct LaneState {
    std::mutex mu;
    uint64_t seq = 0;
  } lanes_[kNumLanes];
  std::shared_ptr<CudaErrorState> errors_ = std::make_shared<CudaErrorState>();

  std::mutex observer_mu_;
  std::shared_ptr<const Observer> observer_;

  // One collector per lane, so that a long kernel on one lane does not hold back the
  // records (and SynchronizeLane) of another.
  struct Collector {
    std::mutex mu;
    std::condition_variable cv;            // wakes the collector
    std::condition_variable delivered_cv;  // wakes SynchronizeLane waiting for records
    std::deque<Pending> pending;
    bool stop = false;
    uint64_t queued = 0;     // observed ops handed to the collector
    uint64_t delivered = 0;  // of those, finished
    std::thread thread;
  } collectors_[kNumLanes];
};

}  // namespace strata
