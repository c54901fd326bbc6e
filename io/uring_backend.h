// UringBackend: IoBackend over io_uring (liburing), the fast path to NVMe.
//
// What it does: opens files with O_DIRECT, registers them in a sparse fixed-file table and
// registers the caller's buffers (READ_FIXED/WRITE_FIXED whenever a request's buffer lies
// inside a registered region), fills the submission queue up to the queue depth, submits
// once, and reaps completions in batches. Short transfers and -EAGAIN are requeued for the
// remainder, so a completion is OK only when every byte moved. Optional SQPOLL.
//
// Ownership: the backend owns one ring and its file descriptors; it never owns buffers,
// which must stay valid (and registered regions mapped) until their completions are
// returned by Poll or the backend is destroyed. The destructor waits for requests already
// handed to the kernel.
//
// Thread safety: none. One ring per instance, one instance per submitting thread: the
// thread that calls Submit also calls Poll and reaps its own completions (docs/design.md "The NVMe
// tier").
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "io/io_file.h"
#include "strata/io.h"

struct io_uring;

namespace strata {

class UringBackend final : public IoBackend {
 public:
  // Sets up the ring. NotSupported naming why when the kernel refuses io_uring (ENOSYS,
  // EPERM, kernel.io_uring_disabled) or refuses SQPOLL; InvalidArgument for queue depth 0.
  static Result<std::unique_ptr<UringBackend>> Create(const IoBackendOptions& options);
  ~UringBackend() override;

  std::string_view Name() const override { return "io_uring"; }
  uint32_t Capabilities() const override;
  uint32_t QueueDepth() const override { return options_.queue_depth; }

  Result<int> OpenFile(const std::string& path, const OpenOptions& options) override;
  Status CloseFile(int file) override;
  bool IsDirect(int file) const override;
  Status Allocate(int file, uint64_t bytes) override;
  Status Sync(int file) override;

  // Adds `regions` to the registered set (regions over 1 GiB are split: the kernel's limit
  // per buffer). REQUIRES: nothing in flight. When the kernel refuses (e.g. RLIMIT_MEMLOCK)
  // a warning says so, requests use plain reads/writes, and the status is still OK.
  Status RegisterBuffers(std::span<const BufferRegion> regions) override;

  Status CheckRequest(const IoRequest& request) const override;
  Status Submit(std::span<const IoRequest> requests) override;
  Result<size_t> Poll(std::span<IoCompletion> out, size_t min_complete) override;
  size_t InFlight() const override { return in_flight_; }

  // Requests served through a registered buffer so far (for tests and `strata bench io`,
  // which report whether the fast path was taken).
  uint64_t fixed_buffer_ops() const { return fixed_buffer_ops_; }
  // Times a short transfer or -EAGAIN was requeued.
  uint64_t requeues() const { return requeues_; }

 private:
  struct File {
    io_internal::FileEntry entry;
    int fixed_slot = -1;  // index in the registered file table, -1 when not registered
    int pending = 0;      // requests not yet completed against this file
  };
  // One request while the backend owns it.
  struct Op {
    IoRequest req;
    uint64_t done = 0;    // bytes moved so far
    int buf_index = -1;   // registered buffer holding the whole request, or -1
    uint32_t eagain = 0;  // consecutive -EAGAIN results
    uint32_t zero_writes = 0;
  };
  struct Region {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    int index = 0;  // registered buffer index
  };

  explicit UringBackend(const IoBackendOptions& options);
  Status Init();
  File* Lookup(int file);
  const File* Lookup(int file) const;
  int FindRegion(const void* buffer, uint64_t length) const;
  // Moves pending ops into free SQ slots; returns how many SQEs were prepared.
  unsigned FillQueue();
  // Handles every completion the ring holds now; returns how many.
  unsigned ReapAvailable();
  void Finish(uint32_t slot, Status status);
  void DrainKernel();  // waits for all ops the kernel holds (destructor)

  IoBackendOptions options_;
  std::unique_ptr<io_uring> ring_;
  bool ring_ready_ = false;
  bool fixed_files_ = false;    // the sparse file table is registered
  bool fixed_buffers_ = false;  // buffers registered and usable
  bool warned_register_ = false;
  uint32_t file_table_size_ = 0;

  std::vector<File> files_;               // index = handle; entry.fd < 0 = free slot
  std::vector<Region> regions_;           // sorted by begin; registered buffers
  std::vector<BufferRegion> registered_;  // what RegisterBuffers was given, split to <= 1 GiB

  std::vector<Op> slots_;  // queue_depth slots; the SQE's user_data is the index
  std::vector<uint32_t> free_slots_;
  std::deque<Op> pending_;          // accepted, not yet in the SQ
  std::deque<IoCompletion> ready_;  // finished, not yet returned by Poll
  uint32_t in_kernel_ = 0;          // SQEs prepared and not yet completed
  size_t in_flight_ = 0;            // accepted by Submit, not yet returned by Poll

  uint64_t fixed_buffer_ops_ = 0;
  uint64_t requeues_ = 0;
};

}  // namespace strata
