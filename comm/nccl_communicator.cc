#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "gpu/cuda_device.h"
#include "gpu/divide_kernel.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

Status NcclStatus(ncclResult_t r, std::string_view call, ncclComm_t comm) {
  std::string msg = std::string(call) + ": " + ncclGetErrorString(r);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') msg += " (" + std::string(detail) + ")";
  return Status::Comm(std::move(msg));
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", ms.count() / 1000.0);
  return buf;
}

// Sleeps between polls, growing from 20 us to 1 ms: responsive for short collectives without
// burning a core on long ones.
class Backoff {
 public:
  void Sleep() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{20};
};

// State shared by the communicator and its handles (handles may outlive it).
struct NcclShared {
  std::mutex mu;  // guards comm against abort while it is used
  ncclComm_t comm = nullptr;
  bool aborted = false;
  Status broken;  // the first failure
  int ordinal = 0;
  std::chrono::milliseconds timeout{0};

  // Records the first failure and aborts the NCCL communicator (which also stops its
  // kernels). REQUIRES: mu held.
  void BreakLocked(const Status& cause) {
    if (broken.ok()) broken = cause;
    if (!aborted && comm != nullptr) {
      (void)ncclCommAbort(comm);
      aborted = true;
    }
  }
  Status BrokenError() {
    return Status::Aborted("the NCCL communicator is broken by an earlier failure: " +
                           broken.ToString());
  }
};

// Waits for a nonblocking NCCL call to leave ncclInProgress. REQUIRES: shared.mu held.
Status SettleLocked(NcclShared& shared, ncclResult_t r, std::string_view call) {
  const auto deadline = Clock::now() + shared.timeout;
  Backoff backoff;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) {
      return Status::Timeout(std::string(call) + " did not finish within " +
                             Seconds(shared.timeout));
    }
    backoff.Sleep();
    if (ncclCommGetAsyncError(shared.comm, &r) != ncclSuccess) break;
  }
  return r == ncclSuccess ? Status::OK() : NcclStatus(r, call, shared.comm);
}

class NcclHandle final : public CommHandle::Impl {
 public:
  NcclHandle(std::shared_ptr<NcclShared> shared, cudaEvent_t done, std::string what)
      : shared_(std::move(shared)), done_(done), what_(std::move(what)) {}
  ~NcclHandle() override {
    DeviceGuard guard(shared_->ordinal);
    (void)cudaEventDestroy(done_);
  }

  Status Wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return status_;
    DeviceGuard guard(shared_->ordinal);
    const auto deadline = Clock::now() + shared_->timeout;
    Backoff backoff;
    for (;;) {
      cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return Finish(Status::OK());
      std::lock_guard<std::mutex> slock(shared_->mu);
      if (q != cudaErrorNotReady) {
        Status s = CudaStatus(q, "cudaEventQuery (" + what_ + ")");
        shared_->BreakLocked(s);
        return Finish(s);
      }
      if (shared_->aborted) return Finish(shared_->BrokenError());
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(shared_->comm, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        Status s = NcclStatus(async, what_, shared_->comm);
        shared_->BreakLocked(s);
        return Finish(s);
      }
      if (Clock::now() > deadline) {
        Status s = Status::Timeout(what_ + " did not complete within " + Seconds(shared_->timeout) +
                                   "; a rank may have died or stopped issuing collectives");
        shared_->BreakLocked(s);
        return Finish(s);
      }
      backoff.Sleep();
    }
  }

  bool Done() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return true;
    DeviceGuard guard(shared_->ordinal);
    return cudaEventQuery(done_) != cudaErrorNotReady;
  }

 private:
  Status Finish(Status s) {
    status_ = std::move(s);
    finished_ = true;
    return status_;
  }

  std::shared_ptr<NcclShared> shared_;
  const cudaEvent_t done_;
  const std::string what_;
  std::mutex mu_;
  bool finished_ = false;
  Status status_;
};

// Host-side timing of one observed collective (see the header).
struct ObservedCall {
  std::shared_ptr<const std::function<void(const CommOpRecord&)>> observer;
  const char* op;
  std::string label;
  uint64_t bytes;
  Clock::time_point start;
  bool ok = true;
};

void StampStart(void* arg) { static_cast<ObservedCall*>(arg)->start = Clock::now(); }

void StampEndAndReport(void* arg) {
  std::unique_ptr<ObservedCall> call(static_cast<ObservedCall*>(arg));
  const auto end = Clock::now();
  (*call->observer)(CommOpRecord{call->op, call->label, call->start, end, call->bytes, call->ok});
}

ncclDataType_t ToNccl(CommDataType t) {
  return t == CommDataType::kFloat32 ? ncclFloat32 : ncclUint8;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclShared> shared, int rank, int world_size,
                   cudaStream_t stream, bool owns_stream, float* scratch,
                   std::shared_ptr<KeyValueStore> store)
      : shared_(std::move(shared)),
        rank_(rank),
        world_size_(world_size),
        stream_(stream),
        owns_stream_(owns_stream),
        scratch_(scratch),
        store_(std::move(store)) {}

  ~NcclCommunicator() override {
    DeviceGuard guard(shared_->ordinal);
    // Let issued collectives finish (bounded by the timeout, which aborts on expiry).
    cudaEvent_t last = nullptr;
    if (cudaEventCreateWithFlags(&last, cudaEventDisableTiming | cudaEventBlockingSync) ==
            cudaSuccess &&
        cudaEventRecord(last, stream_) == cudaSuccess) {
      NcclHandle(shared_, last, "finishing the NCCL communicator's collectives").Wait().ok();
    } else if (last != nullptr) {
      (void)cudaEventDestroy(last);
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->aborted && shared_->comm != nullptr) {
        // A nonblocking communicator is finalized (flushed) before it is destroyed.
        Status s = SettleLocked(*shared_, ncclCommFinalize(shared_->comm), "ncclCommFinalize");
        if (s.ok()) {
          (void)ncclCommDestroy(shared_->comm);
        } else {
          (void)ncclCommAbort(shared_->comm);
        }
        shared_->aborted = true;  // no handle may touch it any more
        if (shared_->broken.ok()) shared_->broken = Status::Aborted("communicator destroyed");
      }
    }
    if (scratch_ != nullptr) {
      (void)cudaFreeAsync(scratch_, stream_);
      (void)cudaStreamSynchronize(stream_);
    }
    if (owns_stream_) (void)cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  const char* backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  CommHandle AllGather(const void* input, void* output, size_t count, CommDataType type,
                       const CollectiveOptions& options) override {
    const uint64_t bytes = uint64_t(world_size_ - 1) * count * CommDataTypeSize(type);
    return Issue("all-gather", options, count, bytes, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(input, output, count, ToNccl(type), c, s);
    });
  }

  CommHandle ReduceScatter(const void* input, void* output, size_t count, CommDataType type,
                           ReduceOp op, const CollectiveOptions& options) override {
    if (type != CommDataType::kFloat32 || op == ReduceOp::kMax) {
      return CommHandle::Completed(Status::InvalidArgument(
          std::string("NCCL reduce-scatter supports fp32 with sum or avg, not ") +
          CommDataTypeName(type) + " with " + ReduceOpName(op)));
    }
    const uint64_t bytes = uint64_t(world_size_ - 1) * count * 4;
    return Issue(
        "reduce-scatter", options, count, bytes,
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclReduceScatter(input, output, count, ncclFloat32, ncclSum, c, s);
        },
        op == ReduceOp::kAverage ? static_cast<float*>(output) : nullptr, count);
  }

  CommHandle AllReduce(const void* input, void* output, size_t count, CommDataType type,
                       ReduceOp op, const CollectiveOptions& options) override {
    if (type != CommDataType::kFloat32) {
      return CommHandle::Completed(Status::InvalidArgument(
          std::string("NCCL all-reduce supports fp32 only, not ") + CommDataTypeName(type)));
    }
    const uint64_t bytes = 2 * uint64_t(world_size_ - 1) * count * 4 / world_size_;
    const ncclRedOp_t nop = op == ReduceOp::kMax ? ncclMax : ncclSum;
    return Issue(
        "all-reduce", options, count, bytes,
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(input, output, count, ncclFloat32, nop, c, s);
        },
        op == ReduceOp::kAverage ? static_cast<float*>(output) : nullptr, count);
  }

  CommHandle Broadcast(void* buffer, size_t count, CommDataType type, int root,
                       const CollectiveOptions& options) override {
    if (root < 0 || root >= world_size_) {
      return CommHandle::Completed(
          Status::InvalidArgument("NCCL broadcast root " + std::to_string(root) +
                                  " is not a rank (0.." + std::to_string(world_size_ - 1) + ")"));
    }
    const uint64_t bytes = count * CommDataTypeSize(type);
    return Issue("broadcast", options, count, bytes, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buffer, buffer, count, ToNccl(type), root, c, s);
    });
  }

  CommHandle Barrier(const CollectiveOptions& options) override {
    return Issue("barrier", options, 1, 0, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, s);
    });
  }

  std::shared_ptr<KeyValueStore> store() const override { return store_; }

  void SetObserver(std::function<void(const CommOpRecord&)> observer) override {
    std::lock_guard<std::mutex> lock(observer_mu_);
    observer_ =
        observer
            ? std::make_shared<const std::function<void(const CommOpRecord&)>>(std::move(observer))
            : nullptr;
  }

 private:
  // Enqueues one collective (and, for kAverage, the division of `divide` by world_size).
  CommHandle Issue(const char* op, const CollectiveOptions& options, size_t count,
                   uint64_t bus_bytes,
                   const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& launch,
                   float* divide = nullptr, size_t divide_count = 0) {
    const std::string what = std::string("NCCL ") + op +
                             (options.label.empty() ? "" : " '" + std::string(options.label) + "'");
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->broken.ok()) return CommHandle::Completed(shared_->BrokenError());
    }
    if (count == 0) return CommHandle::Completed(Status::OK());  // same on every rank
    DeviceGuard guard(shared_->ordinal);
    if (guard.status() != cudaSuccess) {
      return Fail(CudaStatus(guard.status(), "cudaSetDevice").Annotate(what));
    }
    if (options.after) {
      if (auto* ce = dynamic_cast<CudaEvent*>(options.after.get())) {
        cudaError_t err = cudaStreamWaitEvent(stream_, ce->native(), 0);
        if (err != cudaSuccess) return Fail(CudaStatus(err, "cudaStreamWaitEvent").Annotate(what));
      } else {
        // Not a CUDA event (e.g. a host device's): wait for it here.
        Status s = options.after->Synchronize();
        if (!s.ok()) return Fail(s.Annotate(what + ": the event it waits for failed"));
      }
    }
    std::shared_ptr<const std::function<void(const CommOpRecord&)>> observer;
    {
      std::lock_guard<std::mutex> lock(observer_mu_);
      observer = observer_;
    }
    ObservedCall* observed = nullptr;
    if (observer) {
      observed = new ObservedCall{observer, op, std::string(options.label), bus_bytes, {}};
      if (cudaLaunchHostFunc(stream_, &StampStart, observed) != cudaSuccess) {
        delete observed;
        observed = nullptr;
      }
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (shared_->aborted) return CommHandle::Completed(shared_->BrokenError());
      Status s = SettleLocked(*shared_, launch(shared_->comm, stream_), what);
      if (!s.ok()) {
        shared_->BreakLocked(s);
        if (observed != nullptr) {
          observed->ok = false;  // still report it (and free it) from the stream
          if (cudaLaunchHostFunc(stream_, &StampEndAndReport, observed) != cudaSuccess) {
            (void)cudaStreamSynchronize(stream_);  // let the start stamp run first
            delete observed;
          }
        }
        return CommHandle::Completed(s);
      }
    }
    if (divide != nullptr) {
      cudaError_t err = gpu_internal::LaunchDivideKernel(divide, divide_count,
                                                         static_cast<float>(world_size_), stream_);
      if (err != cudaSuccess)
        return Fail(CudaStatus(err, "launching the average's division").Annotate(what));
    }
    if (observed != nullptr &&
        cudaLaunchHostFunc(stream_, &StampEndAndReport, observed) != cudaSuccess) {
      // Not launched: nobody else frees it. The start stamp has been queued before it, so
      // wait for the stream to pass it before freeing.
      (void)cudaStreamSynchronize(stream_);
      delete observed;
    }
    cudaEvent_t done = nullptr;
    cudaError_t err =
        cudaEventCreateWithFlags(&done, cudaEventDisableTiming | cudaEventBlockingSync);
    if (err == cudaSuccess) err = cudaEventRecord(done, stream_);
    if (err != cudaSuccess) {
      if (done != nullptr) (void)cudaEventDestroy(done);
      return Fail(CudaStatus(err, "cudaEventRecord").Annotate(what));
    }
    return CommHandle(std::make_shared<NcclHandle>(shared_, done, what));
  }

  CommHandle Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->BreakLocked(s);
    return CommHandle::Completed(s);
  }

  std::shared_ptr<NcclShared> shared_;
  const int rank_;
  const int world_size_;
  const cudaStream_t stream_;
  const bool owns_stream_;
  float* const scratch_;
  std::shared_ptr<KeyValueStore> store_;
  std::mutex observer_mu_;
  std::shared_ptr<const std::function<void(const CommOpRecord&)>> observer_;
};

}  // namespace

Result<std::string> NcclNewUniqueId() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclStatus(r, "ncclGetUniqueId", nullptr);
  static_assert(sizeof(id) == kNcclUniqueIdBytes);
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclCommOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return Status::InvalidArgument("NCCL communicator: rank " + std::to_string(options.rank) +
                                   " is not within world size " +
                                   std::to_string(options.world_size));
  }
  if (options.unique_id.size() != kNcclUniqueIdBytes) {
    return Status::InvalidArgument("NCCL communicator: the unique id has " +
                                   std::to_string(options.unique_id.size()) + " bytes, not " +
                                   std::to_string(kNcclUniqueIdBytes) +
                                   " (create it with NcclNewUniqueId on one rank)");
  }
  DeviceGuard guard(options.cuda_device);
  if (guard.status() != cudaSuccess) {
    return CudaStatus(guard.status(), "cudaSetDevice(" + std::to_string(options.cuda_device) + ")");
  }
  auto shared = std::make_shared<NcclShared>();
  shared->ordinal = options.cuda_device;
  shared->timeout = options.timeout;

  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  const bool owns_stream = stream == nullptr;
  if (owns_stream) {
    cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return CudaStatus(err, "cudaStreamCreateWithFlags");
  }
  auto cleanup_stream = [&] {
    if (owns_stream) (void)cudaStreamDestroy(stream);
  };

  ncclUniqueId id;
  std::memcpy(&id, options.unique_id.data(), sizeof(id));
  // Nonblocking, so that creation can time out when a rank never shows up.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    ncclResult_t r =
        ncclCommInitRankConfig(&shared->comm, options.world_size, id, options.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      cleanup_stream();
      return NcclStatus(r, "ncclCommInitRankConfig", nullptr)
          .Annotate("creating the NCCL communicator of rank " + std::to_string(options.rank));
    }
    Status s = SettleLocked(*shared, r, "ncclCommInitRankConfig");
    if (!s.ok()) {
      (void)ncclCommAbort(shared->comm);
      cleanup_stream();
      s.Annotate("rank " + std::to_string(options.rank) + " joining " +
                 std::to_string(options.world_size) +
                 " ranks (did every rank start, with the "
                 "same unique id?)");
      return s;
    }
  }
  float* scratch = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&scratch), sizeof(float), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(scratch, 0, sizeof(float), stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    (void)ncclCommAbort(shared->comm);
    cleanup_stream();
    return CudaStatus(err, "allocating the NCCL barrier's scratch buffer");
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      shared, options.rank, options.world_size, stream, owns_stream, scratch, options.store));
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options,
                                                             std::shared_ptr<KeyValueStore> store,
                                                             Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (cuda == nullptr) {
    return Status::InvalidArgument("the NCCL communicator needs a CUDA device, not '" +
                                   device.Name() + "'; use the Gloo communicator instead");
  }
  if (!store) return Status::InvalidArgument("the NCCL communicator needs a key-value store");
  const std::string key = options.store_prefix + "/nccl_id";
  std::string id;
  if (options.rank.rank == 0) {
    STRATA_ASSIGN_OR_RETURN(id, NcclNewUniqueId());
    STRATA_RETURN_IF_ERROR(store->Set(key, id));
  } else {
    STRATA_ASSIGN_OR_RETURN(id, store->Get(key, options.timeout));
  }
  NcclCommOptions o;
  o.rank = options.rank.rank;
  o.world_size = options.rank.world_size;
  o.unique_id = std::move(id);
  o.cuda_device = cuda->ordinal();
  o.stream = cuda->NativeStream(Lane::kComm);
  o.timeout = options.timeout;
  o.store = std::move(store);
  return CreateNcclCommunicator(o);
}

}  // namespace strata
