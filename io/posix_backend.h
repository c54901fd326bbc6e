// PosixBackend: IoBackend over pread/pwrite, run on a oneTBB-managed pool of workers.
//
// The portable fallback, chosen automatically when io_uring cannot be set up. Each request
// becomes one task in a private tbb::task_arena sized to the pool; a task moves the whole
// request (looping over short transfers and EINTR/EAGAIN) and pushes its completion onto a
// queue that Poll drains. Workers block in the kernel, so the pool is sized to the queue
// depth, not to the core count: a tbb::global_control held by the backend lets TBB start
// that many workers (it only raises the ceiling; other arenas keep their own concurrency).
//
// Ownership: the backend owns its file descriptors (closed by CloseFile or the destructor)
// but never the buffers, which must stay valid until their completion is returned by Poll.
// Thread safety: one submitting thread (Submit/Poll/OpenFile/CloseFile) at a time; the
// workers only touch the completion queue, under its mutex. The destructor waits for every
// request in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/io_file.h"
#include "strata/io.h"

namespace strata {

class PosixBackend final : public IoBackend {
 public:
  // InvalidArgument when options.queue_depth is 0.
  static Result<std::unique_ptr<PosixBackend>> Create(const IoBackendOptions& options);
  ~PosixBackend() override;

  std::string_view Name() const override { return "posix"; }
  uint32_t Capabilities() const override;
  uint32_t QueueDepth() const override { return options_.queue_depth; }

  Result<int> OpenFile(const std::string& path, const OpenOptions& options) override;
  Status CloseFile(int file) override;
  bool IsDirect(int file) const override;
  Status Allocate(int file, uint64_t bytes) override;
  Status Sync(int file) override;

  Status CheckRequest(const IoRequest& request) const override;
  Status Submit(std::span<const IoRequest> requests) override;
  Result<size_t> Poll(std::span<IoCompletion> out, size_t min_complete) override;
  size_t InFlight() const override { return in_flight_; }

 private:
  struct File {
    io_internal::FileEntry entry;
    std::atomic<int> pending{0};  // requests queued or running against this file
  };
  struct Pool;  // the TBB arena, task group and global_control (kept out of this header)

  explicit PosixBackend(const IoBackendOptions& options);
  const File* Lookup(int file) const;
  File* Lookup(int file);
  // Runs on a worker: moves all bytes of `r` or returns why not.
  static Status Transfer(const IoRequest& r, const io_internal::FileEntry& f);
  void Complete(IoCompletion c);

  IoBackendOptions options_;
  std::vector<std::shared_ptr<File>> files_;  // index = handle; null = free slot
  size_t in_flight_ = 0;  // submitted, not yet returned by Poll (submitting thread only)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoCompletion> done_;  // guarded by mu_

  std::unique_ptr<Pool> pool_;  // declared last: destroyed (and drained) first
};

}  // namespace strata
