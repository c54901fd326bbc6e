#include "gpu/cuda_device.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "gpu/busy_kernel.h"
#include "gpu/device_util.h"
#include "strata/log.h"

namespace strata {

Status CudaStatus(cudaError_t err, std::string_view call) {
  return Status::Cuda(std::string(call) + ": " + cudaGetErrorString(err) + " (" +
                      cudaGetErrorName(err) + ")");
}

namespace {

#define STRATA_CUDA_RETURN(call)                  \
  do {                                            \
    cudaError_t strata_cuda_err_ = (call);        \
    if (strata_cuda_err_ != cudaSuccess) {        \
      return CudaStatus(strata_cuda_err_, #call); \
    }                                             \
  } while (0)

#define STRATA_CUDA_GUARD(ordinal)                                                               \
  DeviceGuard strata_guard_(ordinal);                                                            \
  if (strata_guard_.status() != cudaSuccess) {                                                   \
    return CudaStatus(strata_guard_.status(), "cudaSetDevice(" + std::to_string(ordinal) + ")"); \
  }

bool ValidLane(Lane lane) { return static_cast<unsigned>(lane) < kNumLanes; }

Status BadLane(Lane lane) {
  return Status::InvalidArgument("cuda device: lane " + std::to_string(static_cast<int>(lane)) +
                                 " does not exist (lanes are 0.." + std::to_string(kNumLanes - 1) +
                                 ")");
}

}  // namespace

// ---- error bookkeeping ----

void CudaErrorState::Fail(Lane lane, uint64_t seq, Status status) {
  std::lock_guard<std::mutex> lock(mu);
  PerLane& l = lanes[static_cast<int>(lane)];
  if (seq < l.error_seq) {
    l.error_seq = seq;
    l.error = status;
  }
  if (first_error.ok()) first_error = std::move(status);
}

Status CudaErrorState::ErrorAtOrBefore(Lane lane, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu);
  const PerLane& l = lanes[static_cast<int>(lane)];
  return l.error_seq <= seq ? l.error : Status::OK();
}

bool CudaErrorState::Failed(Lane lane) {
  std::lock_guard<std::mutex> lock(mu);
  return lanes[static_cast<int>(lane)].error_seq != UINT64_MAX;
}

// ---- events ----

CudaEvent::~CudaEvent() {
  DeviceGuard guard(ordinal_);
  (void)cudaEventDestroy(event_);
}

bool CudaEvent::Query() {
  DeviceGuard guard(ordinal_);
  cudaError_t err = cudaEventQuery(event_);
  return err != cudaErrorNotReady;  // an error also counts as complete (Synchronize says it)
}

Status CudaEvent::Synchronize() {
  DeviceGuard guard(ordinal_);
  cudaError_t err = cudaEventSynchronize(event_);
  if (err != cudaSuccess) {
    // An asynchronous failure of the GPU (e.g. a faulting kernel): the lane is broken.
    Status s =
        CudaStatus(err, std::string("cudaEventSynchronize on the ") + LaneName(lane_) + " lane");
    errors_->Fail(lane_, seq_, s);
    return s;
  }
  return errors_->ErrorAtOrBefore(lane_, seq_);
}

// ---- creation ----

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {}

Result<std::unique_ptr<CudaDevice>> CudaDevice::Create(const DeviceOptions& options) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // not sticky; clear it for later callers
    return Status::NotSupported(
        std::string("no CUDA device present (cudaGetDeviceCount: ") +
        (err == cudaSuccess ? "0 devices" : cudaGetErrorString(err)) +
        "); check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or use the host device");
  }
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(options.cuda_device) +
                                   " does not exist: this machine has " + std::to_string(count) +
                                   " (ordinals 0.." + std::to_string(count - 1) + ")");
  }
  std::unique_ptr<CudaDevice> dev(new CudaDevice(options.cuda_device));
  STRATA_RETURN_IF_ERROR(dev->Init(options));
  return dev;
}

Status CudaDevice::Init(const DeviceOptions& options) {
  STRATA_CUDA_GUARD(ordinal_);
  cudaDeviceProp prop{};
  STRATA_CUDA_RETURN(cudaGetDeviceProperties(&prop, ordinal_));
  name_ = "cuda:" + std::to_string(ordinal_) + " " + prop.name;

  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
  budget_bytes_ = options.memory_budget_bytes;
  reported_budget_ = budget_bytes_ != 0 ? budget_bytes_ : total_bytes;
  if (budget_bytes_ > total_bytes) {
    LogWarning(name_ + ": the device memory budget (" + FormatBytesExact(budget_bytes_) +
               ") exceeds the GPU's memory (" + FormatBytesExact(total_bytes) +
               "); allocations will fail at the GPU's limit first");
  }

  int least = 0, greatest = 0;
  STRATA_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int i = 0; i < kNumLanes; ++i) {
    const int priority = static_cast<Lane>(i) == Lane::kCompute ? least : greatest;
    STRATA_CUDA_RETURN(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking, priority));
  }
  STRATA_CUDA_RETURN(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = ordinal_;
  STRATA_CUDA_RETURN(cudaMemPoolCreate(&pool_, &props));
  // Keep freed memory in the pool: the budget, not the driver, bounds what is held.
  uint64_t threshold = UINT64_MAX;
  STRATA_CUDA_RETURN(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));

  // The anchor that maps GPU event times onto steady_clock: recorded on an idle stream, so
  // it completes at once; the host time right after the wait is its time.
  STRATA_CUDA_RETURN(cudaEventCreateWithFlags(&anchor_, cudaEventBlockingSync));
  STRATA_CUDA_RETURN(cudaEventRecord(anchor_, alloc_stream_));
  STRATA_CUDA_RETURN(cudaEventSynchronize(anchor_));
  anchor_time_ = std::chrono::steady_clock::now();

  for (Collector& c : collectors_) c.thread = std::thread([this, &c] { CollectorLoop(c); });
  return Status::OK();
}

CudaDevice::~CudaDevice() {
  DeviceGuard guard(ordinal_);
  // Wait for each lane's own work (never the whole device: other users may share it).
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)cudaStreamSynchronize(s);
  }
  for (Collector& c : collectors_) {
    if (!c.thread.joinable()) continue;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.stop = true;
    }
    c.cv.notify_all();
    c.thread.join();
  }
  if (pool_ != nullptr) {
    for (auto& [addr, bytes] : allocations_) {
      (void)cudaFreeAsync(reinterpret_cast<void*>(addr), alloc_stream_);
    }
    (void)cudaStreamSynchronize(alloc_stream_);
    (void)cudaMemPoolDestroy(pool_);
  }
  if (anchor_ != nullptr) (void)cudaEventDestroy(anchor_);
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  if (alloc_stream_ != nullptr) (void)cudaStreamDestroy(alloc_stream_);
}

// ---- memory ----

Result<void*> CudaDevice::Allocate(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    if (budget_bytes_ != 0 && (bytes > budget_bytes_ || in_use_bytes_ > budget_bytes_ - bytes)) {
      return gpu_internal::BudgetExceeded(name_, bytes, in_use_bytes_, budget_bytes_);
    }
    in_use_bytes_ += bytes;
  }
  auto unreserve = [&] {
    std::lock_guard<std::mutex> lock(mem_mu_);
    in_use_bytes_ -= bytes;
  };
  DeviceGuard guard(ordinal_);
  if (guard.status() != cudaSuccess) {
    unreserve();
    return CudaStatus(guard.status(), "cudaSetDevice");
  }
  void* ptr = nullptr;
  // Zero bytes still gets a distinct pointer (the pool's granularity covers it).
  cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes == 0 ? 1 : bytes, pool_, alloc_stream_);
  // The allocation becomes usable from every stream once the allocating stream reached it;
  // this waits for that one stream only.
  if (err == cudaSuccess) err = cudaStreamSynchronize(alloc_stream_);
  if (err != cudaSuccess) {
    unreserve();
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation) {
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      return Status::OutOfMemory(name_ + ": the GPU has no room for " + FormatBytesExact(bytes) +
                                 " (" + FormatBytesExact(free_bytes) + " free of " +
                                 FormatBytesExact(total_bytes) +
                                 "; other processes may hold GPU memory); lower the device "
                                 "memory budget or free GPU memory");
    }
    return CudaStatus(err, "cudaMallocFromPoolAsync(" + std::to_string(bytes) + " bytes)");
  }
  std::lock_guard<std::mutex> lock(mem_mu_);
  allocations_.emplace(reinterpret_cast<uintptr_t>(ptr), bytes);
  peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
  return ptr;
}

Status CudaDevice::Free(void* ptr) {
  if (ptr == nullptr) return Status::OK();
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end()) {
      return Status::InvalidArgument(name_ +
                                     ": Free of a pointer this device did not allocate (or "
                                     "already freed)");
    }
    in_use_bytes_ -= it->second;
    allocations_.erase(it);
  }
  STRATA_CUDA_GUARD(ordinal_);
  // The caller guarantees no enqueued work still uses it, so the free needs no ordering
  // against the lanes; the pool keeps the memory for the next Allocate.
  STRATA_CUDA_RETURN(cudaFreeAsync(ptr, alloc_stream_));
  return Status::OK();
}

DeviceMemoryStats CudaDevice::MemoryStats() const {
  std::lock_guard<std::mutex> lock(mem_mu_);
  return DeviceMemoryStats{reported_budget_, in_use_bytes_, peak_bytes_};
}

void CudaDevice::ResetPeak() {
  std::lock_guard<std::mutex> lock(mem_mu_);
  peak_bytes_ = in_use_bytes_;
}

Status CudaDevice::CheckDeviceRange(const void* ptr, size_t bytes, std::string_view what) const {
  if (bytes == 0) return Status::OK();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mem_mu_);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin()) {
    --it;
    if (p - it->first <= it->second && bytes <= it->second - (p - it->first)) {
      return Status::OK();
    }
  }
  if (adopted_.Contains(ptr, bytes)) return Status::OK();
  return Status::InvalidArgument(
      name_ + ": " + std::string(what) + " of " + FormatBytesExact(bytes) +
      ": the device range is not inside one live allocation or adopted "
      "range of this device (host pointer passed as device pointer, or a "
      "freed/overrun buffer?)");
}

// ---- host memory ----

Status CudaDevice::RegisterHostMemory(void* ptr, size_t bytes) {
  if (bytes == 0) return Status::OK();
  if (ptr == nullptr) return Status::InvalidArgument(name_ + ": RegisterHostMemory of null");
  STRATA_CUDA_GUARD(ordinal_);
  cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, "cudaHostRegister(" + FormatBytesExact(bytes) + ")")
        .Annotate("registering the pinned pool with CUDA");
  }
  return Status::OK();
}

Status CudaDevice::AdoptMemory(const void* ptr, size_t bytes) {
  if (ptr == nullptr) return Status::InvalidArgument(name_ + ": AdoptMemory of a null pointer");
  STRATA_CUDA_GUARD(ordinal_);
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, "cudaPointerGetAttributes").Annotate("adopting device memory");
  }
  if (attr.type != cudaMemoryTypeDevice || attr.device != ordinal_) {
    return Status::InvalidArgument(name_ + ": AdoptMemory of " + FormatBytesExact(bytes) +
                                   " that is not device memory of this GPU (a CPU tensor, or "
                                   "one on another GPU?)");
  }
  std::lock_guard<std::mutex> lock(mem_mu_);
  adopted_.Add(ptr, bytes);
  return Status::OK();
}

Status CudaDevice::ForgetMemory(const void* ptr) {
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (!adopted_.Remove(ptr)) {
    return Status::InvalidArgument(name_ + ": ForgetMemory of memory that is not adopted");
  }
  return Status::OK();
}

Status CudaDevice::UnregisterHostMemory(void* ptr) {
  if (ptr == nullptr) return Status::OK();
  STRATA_CUDA_GUARD(ordinal_);
  cudaError_t err = cudaHostUnregister(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, "cudaHostUnregister");
  }
  return Status::OK();
}

// ---- enqueueing ----

std::shared_ptr<const CudaDevice::Observer> CudaDevice::CurrentObserver() {
  std::lock_guard<std::mutex> lock(observer_mu_);
  return observer_;
}

void CudaDevice::SetObserver(std::function<void(const DeviceOpRecord&)> observer) {
  auto ptr = observer ? std::make_shared<const Observer>(std::move(observer)) : nullptr;
  std::lock_guard<std::mutex> lock(observer_mu_);
  observer_ = std::move(ptr);
}

Status CudaDevice::EnqueueGpuOp(Lane lane, std::string_view label, uint64_t bytes,
                                const std::function<cudaError_t(cudaStream_t)>& launch,
                                std::string_view call) {
  STRATA_CUDA_GUARD(ordinal_);
  LaneState& state = lanes_[static_cast<int>(lane)];
  cudaStream_t stream = streams_[static_cast<int>(lane)];
  std::shared_ptr<const Observer> observer = CurrentObserver();

  std::lock_guard<std::mutex> lock(state.mu);
  if (errors_->Failed(lane)) return Status::OK();  // a failed lane drops later work
  const uint64_t seq = ++state.seq;
  cudaEvent_t start = nullptr, end = nullptr;
  auto fail = [&](cudaError_t err, std::string what) {
    if (start) (void)cudaEventDestroy(start);
    if (end) (void)cudaEventDestroy(end);
    Status s = CudaStatus(err, what);
    s.Annotate(name_ + ", " + LaneName(lane) + " lane, '" + std::string(label) + "'");
    errors_->Fail(lane, seq, s);
    return s;
  };
  if (observer) {
    cudaError_t err = cudaEventCreateWithFlags(&start, cudaEventBlockingSync);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&end, cudaEventBlockingSync);
    if (err == cudaSuccess) err = cudaEventRecord(start, stream);
    if (err != cudaSuccess) return fail(err, "cudaEventRecord (observer timing)");
  }
  cudaError_t err = launch(stream);
  if (err != cudaSuccess) return fail(err, std::string(call));
  if (observer) {
    err = cudaEventRecord(end, stream);
    if (err != cudaSuccess) return fail(err, "cudaEventRecord (observer timing)");
    Collector& c = collectors_[static_cast<int>(lane)];
    {
      std::lock_guard<std::mutex> clock(c.mu);
      c.pending.push_back(Pending{lane, std::string(label), bytes, start, end, observer});
      ++c.queued;
    }
    c.cv.notify_one();
  }
  return Status::OK();
}

Status CudaDevice::CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                                std::string_view label, Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (bytes != 0 && host_src == nullptr) {
    return Status::InvalidArgument(name_ + ": CopyToDevice '" + std::string(label) +
                                   "' from a null host pointer");
  }
  STRATA_RETURN_IF_ERROR(
      CheckDeviceRange(device_dst, bytes, "CopyToDevice '" + std::string(label) + "'"));
  return EnqueueGpuOp(
      lane, label, bytes,
      [&](cudaStream_t s) {
        return bytes == 0 ? cudaSuccess
                          : cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, s);
      },
      "cudaMemcpyAsync(host to device, " + std::to_string(bytes) + " bytes)");
}

Status CudaDevice::CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                              std::string_view label, Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (bytes != 0 && host_dst == nullptr) {
    return Status::InvalidArgument(name_ + ": CopyToHost '" + std::string(label) +
                                   "' to a null host pointer");
  }
  STRATA_RETURN_IF_ERROR(
      CheckDeviceRange(device_src, bytes, "CopyToHost '" + std::string(label) + "'"));
  return EnqueueGpuOp(
      lane, label, bytes,
      [&](cudaStream_t s) {
        return bytes == 0 ? cudaSuccess
                          : cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s);
      },
      "cudaMemcpyAsync(device to host, " + std::to_string(bytes) + " bytes)");
}

Status CudaDevice::EnqueueBusy(Lane lane, std::chrono::nanoseconds duration,
                               std::string_view label) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (duration.count() < 0) {
    return Status::InvalidArgument(name_ + ": EnqueueBusy '" + std::string(label) +
                                   "' with a negative duration");
  }
  const uint64_t ns = static_cast<uint64_t>(duration.count());
  return EnqueueGpuOp(
      lane, label, 0, [ns](cudaStream_t s) { return gpu_internal::LaunchBusyKernel(ns, s); },
      "launching the busy kernel");
}

// The state a host function carries through cudaLaunchHostFunc.
struct CudaDevice::HostFnCall {
  Lane lane;
  uint64_t seq;
  std::string label;
  std::function<Status()> fn;
  std::shared_ptr<CudaErrorState> errors;
  std::shared_ptr<const Observer> observer;
  std::string device_name;
};

void CudaDevice::HostFnTrampoline(void* arg) {
  std::unique_ptr<HostFnCall> call(static_cast<HostFnCall*>(arg));
  // Earlier failure on this lane: skip, like every later op of a failed lane.
  if (!call->errors->ErrorAtOrBefore(call->lane, call->seq).ok()) return;
  const auto start = std::chrono::steady_clock::now();
  Status status;
  try {
    status = call->fn();
  } catch (const std::exception& e) {
    status = Status::Aborted("host function threw: " + std::string(e.what()));
  } catch (...) {
    status = Status::Aborted("host function threw a non-standard exception");
  }
  const auto end = std::chrono::steady_clock::now();
  const bool ok = status.ok();
  if (!ok) {
    status.Annotate(call->device_name + ", " + LaneName(call->lane) + " lane, '" + call->label +
                    "'");
    call->errors->Fail(call->lane, call->seq, std::move(status));
  }
  if (call->observer) (*call->observer)(DeviceOpRecord{call->lane, call->label, start, end, 0, ok});
}

Status CudaDevice::EnqueueHostFunction(Lane lane, std::function<Status()> fn,
                                       std::string_view label) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (!fn) {
    return Status::InvalidArgument(name_ + ": EnqueueHostFunction '" + std::string(label) +
                                   "' with an empty function");
  }
  STRATA_CUDA_GUARD(ordinal_);
  LaneState& state = lanes_[static_cast<int>(lane)];
  std::lock_guard<std::mutex> lock(state.mu);
  if (errors_->Failed(lane)) return Status::OK();
  const uint64_t seq = ++state.seq;
  auto call = std::make_unique<HostFnCall>(
      HostFnCall{lane, seq, std::string(label), std::move(fn), errors_, CurrentObserver(), name_});
  cudaError_t err =
      cudaLaunchHostFunc(streams_[static_cast<int>(lane)], &HostFnTrampoline, call.get());
  if (err != cudaSuccess) {
    Status s = CudaStatus(err, "cudaLaunchHostFunc");
    s.Annotate(name_ + ", " + LaneName(lane) + " lane, '" + std::string(label) + "'");
    errors_->Fail(lane, seq, s);
    return s;
  }
  call.release();  // owned by the trampoline now
  return Status::OK();
}

// ---- events ----

Result<EventPtr> CudaDevice::Record(Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  STRATA_CUDA_GUARD(ordinal_);
  LaneState& state = lanes_[static_cast<int>(lane)];
  std::lock_guard<std::mutex> lock(state.mu);
  cudaEvent_t ev = nullptr;
  STRATA_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync));
  auto event = std::make_shared<CudaEvent>(ordinal_, ev, lane, state.seq, errors_);
  STRATA_CUDA_RETURN(cudaEventRecord(ev, streams_[static_cast<int>(lane)]));
  return EventPtr(std::move(event));
}

Status CudaDevice::WaitEvent(Lane lane, const EventPtr& event) {
  if (!ValidLane(lane)) return BadLane(lane);
  auto* cuda_event = dynamic_cast<CudaEvent*>(event.get());
  if (cuda_event == nullptr) {
    return Status::InvalidArgument(
        name_ + ": WaitEvent needs an event recorded on a CUDA device (got " +
        (event ? "an event of another device kind" : std::string("a null event")) + ")");
  }
  STRATA_CUDA_GUARD(ordinal_);
  LaneState& state = lanes_[static_cast<int>(lane)];
  std::lock_guard<std::mutex> lock(state.mu);
  STRATA_CUDA_RETURN(
      cudaStreamWaitEvent(streams_[static_cast<int>(lane)], cuda_event->native(), 0));
  return Status::OK();
}

Status CudaDevice::SynchronizeLane(Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  Collector& c = collectors_[static_cast<int>(lane)];
  uint64_t queued;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    queued = c.queued;
  }
  STRATA_ASSIGN_OR_RETURN(EventPtr event, Record(lane));
  Status s = event->Synchronize();
  // The collector delivers records in submission order and the lane's work is done, so
  // this wait is short.
  std::unique_lock<std::mutex> lock(c.mu);
  c.delivered_cv.wait(lock, [&] { return c.delivered >= queued; });
  return s;
}

Status CudaDevice::Error() const {
  std::lock_guard<std::mutex> lock(errors_->mu);
  return errors_->first_error;
}

void* CudaDevice::NativeStream(Lane lane) {
  return ValidLane(lane) ? static_cast<void*>(streams_[static_cast<int>(lane)]) : nullptr;
}

// ---- observer collector ----

void CudaDevice::CollectorLoop(Collector& c) {
  DeviceGuard guard(ordinal_);
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(c.mu);
      c.cv.wait(lock, [&] { return c.stop || !c.pending.empty(); });
      if (c.pending.empty()) return;
      p = std::move(c.pending.front());
      c.pending.pop_front();
    }
    // Blocking-sync events: this thread sleeps until the op is done.
    cudaError_t err = cudaEventSynchronize(p.end);
    float start_ms = 0, end_ms = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&start_ms, anchor_, p.start);
    if (err == cudaSuccess) err = cudaEventElapsedTime(&end_ms, anchor_, p.end);
    if (err == cudaSuccess) {
      using Ms = std::chrono::duration<double, std::milli>;
      auto start =
          anchor_time_ + std::chrono::duration_cast<std::chrono::nanoseconds>(Ms(start_ms));
      auto end = anchor_time_ + std::chrono::duration_cast<std::chrono::nanoseconds>(Ms(end_ms));
      (*p.observer)(DeviceOpRecord{p.lane, p.label, start, std::max(start, end), p.bytes, true});
    } else {
      (void)cudaGetLastError();  // the lane's own Synchronize reports the failure
    }
    (void)cudaEventDestroy(p.start);
    (void)cudaEventDestroy(p.end);
    {
      std::lock_guard<std::mutex> lock(c.mu);
      ++c.delivered;
    }
    c.delivered_cv.notify_all();
  }
}

// ---- factory ----

Result<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> dev, CudaDevice::Create(options));
  return std::unique_ptr<Device>(std::move(dev));
}

bool CudaAvailable() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err == cudaSuccess && count > 0;
}

}  // namespace strata
