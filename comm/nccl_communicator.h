// The NCCL backend of strata::Communicator (strata/comm.h): collectives between GPUs, with
// buffers in device memory, issued on one CUDA stream (a CudaDevice's Lane::kComm stream, or
// one the caller names). Internal header; it includes neither CUDA nor NCCL headers, so it
// can be included anywhere, but its functions exist only in CUDA builds (strata_comm compiles
// this backend when STRATA_HAVE_CUDA; otherwise comm/nccl_unavailable.cc answers NotSupported
// for the public rendezvous form). Ranks meet through a KeyValueStore alone: the
// rendezvous form reads rank 0's unique id from the store; nothing else is exchanged.
//
// How it runs: each collective is enqueued on the stream (after a cudaStreamWaitEvent on
// CollectiveOptions::after when that is a CUDA event; any other event is waited for on the
// issuing thread) and followed by a completion event. CommHandle::Wait polls that event and
// ncclCommGetAsyncError with short sleeps (never a hot spin, never a device-wide
// synchronisation) so that it can give up: past the communicator's timeout the NCCL
// communicator is aborted and the handle returns Timeout; an asynchronous NCCL error
// (a peer died, a network failure) aborts it and returns Comm. As comm.h requires, the
// communicator is broken after its first failure: later collectives fail at once with
// Aborted and the original cause.
//
// Numerics: kAverage is a sum followed by an IEEE division by world_size on the stream (not
// ncclAvg, which pre-multiplies by 1/N), so results match the Gloo backend's definition.
// Barrier is a one-element all-reduce on a scratch buffer.
//
// Observer: when set, each collective is bracketed by two host functions on the stream that
// take the host time; the second calls the observer. This adds a few microseconds per
// collective, only while an observer is set.
//
// Thread safety: as comm.h: collectives are issued from one thread at a time, in the same
// order on every rank; handles may be waited on from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "strata/comm.h"
#include "strata/device.h"
#include "strata/status.h"

namespace strata {

// Size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A fresh NCCL unique id, as kNcclUniqueIdBytes bytes, created by one rank and handed to
// the others (through a KeyValueStore, or any other channel). Comm on failure.
Result<std::string> NcclNewUniqueId();

struct NcclCommOptions {
  int rank = 0;
  int world_size = 1;
  std::string unique_id;  // kNcclUniqueIdBytes bytes from NcclNewUniqueId()
  int cuda_device = 0;    // the GPU this rank's buffers live on
  // The cudaStream_t collectives run on; nullptr: the communicator creates its own
  // non-blocking stream.
  void* stream = nullptr;
  // Bounds communicator creation and every collective's Wait.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Returned by store(); may be null when the id was shared some other way.
  std::shared_ptr<KeyValueStore> store;
};

// Joins the `world_size` ranks that share `unique_id`; blocks until all joined or
// options.timeout passed (Timeout). InvalidArgument for a bad rank/size/id length;
// Comm for NCCL failures, Cuda for CUDA failures, each naming the call.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclCommOptions& options);

// The rendezvous form, CreateNcclCommunicator(const CommOptions&, store, Device&), is public:
// it is declared in strata/comm.h (and reports NotSupported in a build without CUDA).

}  // namespace strata
