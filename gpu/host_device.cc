#include "gpu/host_device.h"

#include <sanitizer/asan_interface.h>  // no-op macros unless built with AddressSanitizer

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>

#include "gpu/device_util.h"

namespace strata {

using gpu_internal::kDeviceAlignment;

// An event of a HostDevice lane: completed by the lane's worker when it reaches the event,
// carrying the lane's error at that point.
class HostEvent final : public DeviceEvent {
 public:
  bool Query() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    return status_;
  }
  void Complete(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(status);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

namespace {

bool ValidLane(Lane lane) { return static_cast<unsigned>(lane) < kNumLanes; }

Status BadLane(Lane lane) {
  return Status::InvalidArgument("host device: lane " + std::to_string(static_cast<int>(lane)) +
                                 " does not exist (lanes are 0.." + std::to_string(kNumLanes - 1) +
                                 ")");
}

}  // namespace

HostDevice::HostDevice(const DeviceOptions& options) : budget_bytes_(options.memory_budget_bytes) {
  for (int i = 0; i < kNumLanes; ++i) {
    lanes_[i].worker = std::thread([this, i] { WorkerLoop(static_cast<Lane>(i)); });
  }
}

HostDevice::~HostDevice() {
  // Finish everything already enqueued (callers may still be waiting on its events), then
  // stop the workers.
  for (LaneState& state : lanes_) {
    {
      std::lock_guard<std::mutex> lock(state.mu);
      state.stop = true;
    }
    state.cv.notify_all();
  }
  for (LaneState& state : lanes_) {
    if (state.worker.joinable()) state.worker.join();
  }
  for (auto& [addr, bytes] : allocations_) std::free(reinterpret_cast<void*>(addr));
  ReleaseCachedLocked();  // no other thread is left
}

// ---- memory ----

Result<void*> HostDevice::Allocate(size_t bytes) {
  // A zero-byte request still gets a distinct, freeable pointer.
  const size_t rounded = RoundUp(bytes == 0 ? 1 : bytes, kDeviceAlignment);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    if (budget_bytes_ != 0 && (bytes > budget_bytes_ || in_use_bytes_ > budget_bytes_ - bytes)) {
      return gpu_internal::BudgetExceeded("host device", bytes, in_use_bytes_, budget_bytes_);
    }
    in_use_bytes_ += bytes;  // reserve before the (slow) allocation
    auto it = cached_.find(rounded);
    if (it != cached_.end()) {
      ptr = it->second;
      cached_bytes_ -= rounded;
      cached_.erase(it);
      ASAN_UNPOISON_MEMORY_REGION(ptr, rounded);
    }
  }
  if (ptr == nullptr) ptr = std::aligned_alloc(kDeviceAlignment, rounded);
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (ptr == nullptr && !cached_.empty()) {  // the kept blocks may be what RAM lacks
    ReleaseCachedLocked();
    ptr = std::aligned_alloc(kDeviceAlignment, rounded);
  }
  if (ptr == nullptr) {
    in_use_bytes_ -= bytes;
    return Status::OutOfMemory("host device: host RAM exhausted allocating " +
                               FormatBytesExact(bytes) +
                               " (within the device budget); lower the device memory budget "
                               "or free host memory");
  }
  allocations_.emplace(reinterpret_cast<uintptr_t>(ptr), bytes);
  if (in_use_bytes_ > peak_bytes_) peak_bytes_ = in_use_bytes_;
  live_rounded_bytes_ += rounded;
  high_water_rounded_bytes_ = std::max(high_water_rounded_bytes_, live_rounded_bytes_);
  return ptr;
}

Status HostDevice::Free(void* ptr) {
  if (ptr == nullptr) return Status::OK();
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end()) {
      return Status::InvalidArgument(
          "host device: Free of a pointer this device did not allocate (or already freed)");
    }
    const size_t rounded = RoundUp(it->second == 0 ? 1 : it->second, kDeviceAlignment);
    in_use_bytes_ -= it->second;
    live_rounded_bytes_ -= rounded;
    allocations_.erase(it);
    if (cached_bytes_ + rounded <= high_water_rounded_bytes_) {
      // Under ASan a kept block stays off limits, as freed memory would be.
      ASAN_POISON_MEMORY_REGION(ptr, rounded);
      cached_.emplace(rounded, ptr);
      cached_bytes_ += rounded;
      return Status::OK();
    }
  }
  std::free(ptr);
  return Status::OK();
}

void HostDevice::ReleaseCachedLocked() {
  for (auto& [rounded, ptr] : cached_) {
    ASAN_UNPOISON_MEMORY_REGION(ptr, rounded);
    std::free(ptr);
  }
  cached_.clear();
  cached_bytes_ = 0;
}

DeviceMemoryStats HostDevice::MemoryStats() const {
  std::lock_guard<std::mutex> lock(mem_mu_);
  return DeviceMemoryStats{budget_bytes_, in_use_bytes_, peak_bytes_};
}

void HostDevice::ResetPeak() {
  std::lock_guard<std::mutex> lock(mem_mu_);
  peak_bytes_ = in_use_bytes_;
}

Status HostDevice::RegisterHostMemory(void* ptr, size_t bytes) {
  if (ptr == nullptr && bytes != 0) {
    return Status::InvalidArgument("host device: RegisterHostMemory of a null pointer");
  }
  return Status::OK();  // host memory is already "device-accessible" here
}

Status HostDevice::UnregisterHostMemory(void*) { return Status::OK(); }

Status HostDevice::AdoptMemory(const void* ptr, size_t bytes) {
  if (ptr == nullptr) return Status::InvalidArgument("host device: AdoptMemory of a null pointer");
  std::lock_guard<std::mutex> lock(mem_mu_);
  adopted_.Add(ptr, bytes);
  return Status::OK();
}

Status HostDevice::ForgetMemory(const void* ptr) {
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (!adopted_.Remove(ptr)) {
    return Status::InvalidArgument("host device: ForgetMemory of memory that is not adopted");
  }
  return Status::OK();
}

Status HostDevice::CheckDeviceRange(const void* ptr, size_t bytes, std::string_view what) const {
  if (bytes == 0) return Status::OK();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mem_mu_);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin()) {
    --it;
    if (p >= it->first && p - it->first <= it->second && bytes <= it->second - (p - it->first)) {
      return Status::OK();
    }
  }
  if (adopted_.Contains(ptr, bytes)) return Status::OK();
  return Status::InvalidArgument(
      "host device: " + std::string(what) + " of " + FormatBytesExact(bytes) +
      ": the device range is not inside one live allocation or adopted "
      "range of this device (host pointer passed as device pointer, or a "
      "freed/overrun buffer?)");
}

// ---- enqueueing ----

Status HostDevice::Enqueue(Lane lane, Op op) {
  LaneState& state = lanes_[static_cast<int>(lane)];
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.stop) return Status::Aborted("host device: enqueue after shutdown began");
    if (op.kind == Op::Kind::kRecord && state.queue.empty() && !state.running) {
      op.record->Complete(state.error);  // Record on an idle lane: no hand-off (see Record)
      return Status::OK();
    }
    state.queue.push_back(std::move(op));
  }
  state.cv.notify_one();
  return Status::OK();
}

Status HostDevice::CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                                std::string_view label, Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (bytes != 0 && host_src == nullptr) {
    return Status::InvalidArgument("host device: CopyToDevice '" + std::string(label) +
                                   "' from a null host pointer");
  }
  STRATA_RETURN_IF_ERROR(
      CheckDeviceRange(device_dst, bytes, "CopyToDevice '" + std::string(label) + "'"));
  Op op;
  op.kind = Op::Kind::kCopy;
  op.label = std::string(label);
  op.dst = device_dst;
  op.src = host_src;
  op.bytes = bytes;
  return Enqueue(lane, std::move(op));
}

Status HostDevice::CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                              std::string_view label, Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (bytes != 0 && host_dst == nullptr) {
    return Status::InvalidArgument("host device: CopyToHost '" + std::string(label) +
                                   "' to a null host pointer");
  }
  STRATA_RETURN_IF_ERROR(
      CheckDeviceRange(device_src, bytes, "CopyToHost '" + std::string(label) + "'"));
  Op op;
  op.kind = Op::Kind::kCopy;
  op.label = std::string(label);
  op.dst = host_dst;
  op.src = device_src;
  op.bytes = bytes;
  return Enqueue(lane, std::move(op));
}

Status HostDevice::EnqueueHostFunction(Lane lane, std::function<Status()> fn,
                                       std::string_view label) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (!fn) {
    return Status::InvalidArgument("host device: EnqueueHostFunction '" + std::string(label) +
                                   "' with an empty function");
  }
  Op op;
  op.kind = Op::Kind::kHostFunction;
  op.label = std::string(label);
  op.fn = std::move(fn);
  return Enqueue(lane, std::move(op));
}

Status HostDevice::EnqueueBusy(Lane lane, std::chrono::nanoseconds duration,
                               std::string_view label) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (duration.count() < 0) {
    return Status::InvalidArgument("host device: EnqueueBusy '" + std::string(label) +
                                   "' with a negative duration");
  }
  Op op;
  op.kind = Op::Kind::kBusy;
  op.label = std::string(label);
  op.duration = duration;
  return Enqueue(lane, std::move(op));
}

// An event recorded on an idle lane completes at once, as its worker would complete it, with
// the lane's error: no hand-off to the worker. Acquire, Release and SubmitGrads each record on
// the compute lane, which the layer's CPU compute leaves idle, and each hand-off was two thread
// wake-ups; on a machine with fewer free cores than busy threads each one waited for a
// time slice (ms).
Result<EventPtr> HostDevice::Record(Lane lane) {
  if (!ValidLane(lane)) return BadLane(lane);
  auto event = std::make_shared<HostEvent>();
  Op op;
  op.kind = Op::Kind::kRecord;
  op.record = event;
  STRATA_RETURN_IF_ERROR(Enqueue(lane, std::move(op)));
  return EventPtr(std::move(event));
}

// Waiting for an event that completed without error orders nothing: no operation is queued.
// One that failed is queued, so that the lane takes the error in order.
Status HostDevice::WaitEvent(Lane lane, const EventPtr& event) {
  if (!ValidLane(lane)) return BadLane(lane);
  if (!event) return Status::InvalidArgument("host device: WaitEvent on a null event");
  if (event->Query() && event->Synchronize().ok()) return Status::OK();
  Op op;
  op.kind = Op::Kind::kWait;
  op.wait = event;
  return Enqueue(lane, std::move(op));
}

Status HostDevice::SynchronizeLane(Lane lane) {
  STRATA_ASSIGN_OR_RETURN(EventPtr event, Record(lane));
  return event->Synchronize();
}

Status HostDevice::Error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return first_error_;
}

void HostDevice::SetObserver(std::function<void(const DeviceOpRecord&)> observer) {
  auto ptr =
      observer
          ? std::make_shared<const std::function<void(const DeviceOpRecord&)>>(std::move(observer))
          : nullptr;
  std::lock_guard<std::mutex> lock(observer_mu_);
  observer_ = std::move(ptr);
}

// ---- workers ----

void HostDevice::WorkerLoop(Lane lane) {
  LaneState& state = lanes_[static_cast<int>(lane)];
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(state.mu);
      state.cv.wait(lock, [&] { return state.stop || !state.queue.empty(); });
      if (state.queue.empty()) return;  // stop requested and everything drained
      op = std::move(state.queue.front());
      state.queue.pop_front();
      if (op.kind == Op::Kind::kRecord) {
        // Completed without leaving the idle state: once the caller sees the lane's last
        // event complete, the lane reads as idle, and its next Record completes at once.
        op.record->Complete(state.error);
        continue;
      }
      state.running = true;
    }
    RunOp(lane, state, op);
    op = Op();  // its captures and events go before the lane reads as idle
    std::lock_guard<std::mutex> lock(state.mu);
    state.running = false;
  }
}

void HostDevice::SetError(Lane lane, LaneState& state, Status status) {
  status.Annotate("host device, " + std::string(LaneName(lane)) + " lane");
  state.error = status;
  std::lock_guard<std::mutex> lock(error_mu_);
  if (first_error_.ok()) first_error_ = std::move(status);
}

void HostDevice::RunOp(Lane lane, LaneState& state, Op& op) {
  // kRecord never gets here: Enqueue or WorkerLoop completes it without running the lane.
  if (!state.error.ok()) return;  // a failed lane skips the rest of its work
  if (op.kind == Op::Kind::kWait) {
    Status s = op.wait->Synchronize();
    if (!s.ok()) {
      s.Annotate("waiting for an event whose work failed");
      SetError(lane, state, std::move(s));
    }
    return;
  }

  const auto start = std::chrono::steady_clock::now();
  Status status;
  uint64_t bytes = 0;
  switch (op.kind) {
    case Op::Kind::kCopy:
      if (op.bytes != 0) std::memcpy(op.dst, op.src, op.bytes);
      bytes = op.bytes;
      break;
    case Op::Kind::kHostFunction:
      // A throwing function must not take the worker (and the process) down.
      try {
        status = op.fn();
      } catch (const std::exception& e) {
        status = Status::Aborted("host function threw: " + std::string(e.what()));
      } catch (...) {
        status = Status::Aborted("host function threw a non-standard exception");
      }
      op.fn = nullptr;  // release captures on the worker, before the next op
      break;
    case Op::Kind::kBusy: {
      // Sleeping models a kernel: the lane is occupied, the host CPU is not.
      const auto deadline = start + op.duration;
      while (std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_until(deadline);
      break;
    }
    case Op::Kind::kRecord:
    case Op::Kind::kWait:
      break;
  }
  const auto end = std::chrono::steady_clock::now();

  const bool ok = status.ok();
  if (!ok) {
    status.Annotate("'" + op.label + "'");
    SetError(lane, state, std::move(status));
  }
  std::shared_ptr<const std::function<void(const DeviceOpRecord&)>> observer;
  {
    std::lock_guard<std::mutex> lock(observer_mu_);
    observer = observer_;
  }
  if (observer) (*observer)(DeviceOpRecord{lane, op.label, start, end, bytes, ok});
}

Result<std::unique_ptr<Device>> CreateHostDevice(const DeviceOptions& options) {
  return std::unique_ptr<Device>(std::make_unique<HostDevice>(options));
}

}  // namespace strata
