// IoBackend: asynchronous block I/O against files, the "Env" of Strata's NVMe tier.
//
// A backend opens files, takes batches of reads and writes (file, offset, length, buffer),
// and hands back completions. Three implementations: UringBackend (io_uring with O_DIRECT,
// registered buffers and files, batched submission), PosixBackend (pread/pwrite on a oneTBB
// worker pool; chosen at run time when io_uring cannot be set up) and a fault-injecting wrapper
// (strata/fault_injection.h: EIO, short transfers, EAGAIN, ENOSPC, delays and flipped bits,
// for tests). The base class gives every backend a synchronous default, so a backend
// with no asynchronous machinery is complete on day one.
//
// Thread safety: a backend instance is used by ONE submitting thread at a time (io_uring:
// one ring per submitting thread). Create one backend per thread that submits I/O.
//
// Transfers are all-or-nothing from the caller's view: a completion's status is OK only when
// every byte was transferred; short transfers and -EAGAIN are retried inside the backend.
// A file opened with `direct` needs offset, length and buffer address aligned to
// kIoAlignment; a file system without O_DIRECT (tmpfs) falls back to buffered I/O with one
// warning, and IsDirect() tells which mode a file got.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

// Alignment of offsets, lengths and buffer addresses for O_DIRECT files.
inline constexpr uint64_t kIoAlignment = 4096;

enum class IoOp : uint8_t { kRead, kWrite };

struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;           // a handle returned by IoBackend::OpenFile
  uint64_t offset = 0;     // byte offset in the file
  void* buffer = nullptr;  // source (write) or destination (read)
  uint64_t length = 0;     // bytes
  uint64_t user_data = 0;  // returned unchanged in the completion
};

struct IoCompletion {
  uint64_t user_data = 0;
  Status status;  // OK when all `length` bytes moved; else names the file and offset
};

// Capability bits: what a backend instance actually got from the kernel.
enum IoCapability : uint32_t {
  kIoCapAsync = 1u << 0,         // more than one request in flight at once
  kIoCapDirect = 1u << 1,        // O_DIRECT honoured (per file: IsDirect)
  kIoCapFixedBuffers = 1u << 2,  // registered buffers in use
  kIoCapFixedFiles = 1u << 3,    // registered files in use
  kIoCapSqpoll = 1u << 4,        // kernel submission-queue polling thread
};

enum class IoBackendKind : uint8_t { kAuto, kUring, kPosix };

struct IoBackendOptions {
  IoBackendKind kind = IoBackendKind::kAuto;  // kAuto: io_uring, else posix with one warning
  uint32_t queue_depth = 32;                  // requests in flight at most; must be >= 1
  bool direct = true;                         // open files with O_DIRECT (where supported)
  bool fixed_buffers = true;                  // register buffers given to RegisterBuffers
  bool fixed_files = true;                    // register opened files with the ring
  bool sqpoll = false;                        // io_uring SQPOLL thread (uring only)
  uint32_t posix_threads = 0;                 // PosixBackend workers; 0 = queue_depth
};

struct OpenOptions {
  bool create = false;     // create when missing
  bool read_only = false;  // open O_RDONLY
  bool direct = true;      // ask for O_DIRECT (and the backend's options must allow it)
  // Open `path` relative to this open folder (openat) instead of the working folder; the
  // caller keeps it open for the call. -1: `path` as given.
  int dir_fd = -1;
  // Refuse (InvalidArgument naming the path) a symbolic link, anything but a regular file,
  // and a regular file with more than one hard link: the file cannot lead outside its folder.
  bool no_follow = false;
  // With create: the file must not exist yet (O_EXCL); IOError with EEXIST when it does.
  bool exclusive = false;
  uint32_t mode = 0644;  // permission bits of a created file (the umask still applies)
};

struct BufferRegion {
  void* data = nullptr;
  size_t size = 0;
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  virtual std::string_view Name() const = 0;  // "io_uring", "posix", "fault(io_uring)"
  virtual uint32_t Capabilities() const = 0;  // IoCapability bits
  virtual uint32_t QueueDepth() const = 0;

  // Opens (optionally creates) `path`. Returns a file handle for IoRequest::file.
  // Fails with NotFound, InvalidArgument or IOError naming the path.
  virtual Result<int> OpenFile(const std::string& path, const OpenOptions& options) = 0;
  virtual Status CloseFile(int file) = 0;
  // Whether `file` was opened with O_DIRECT (false after a buffered fallback).
  virtual bool IsDirect(int file) const = 0;
  // Reserves `bytes` of disk for the file (fallocate). NoSpace when the disk is too small.
  virtual Status Allocate(int file, uint64_t bytes) = 0;
  // Makes completed writes to `file` durable (fdatasync).
  virtual Status Sync(int file) = 0;

  // Registers memory that later requests use as buffers (io_uring fixed buffers). Requests
  // whose buffer lies inside a registered region use the fast path; others still work.
  // Default: accepted and ignored.
  virtual Status RegisterBuffers(std::span<const BufferRegion> regions) {
    (void)regions;
    return Status::OK();
  }

  // Checks `request` as Submit would (known file, alignment for O_DIRECT, not a write to a
  // read-only file) without queueing it: InvalidArgument saying what is wrong. Wrappers use
  // it to refuse a bad request before injecting anything. Default: accepts everything.
  virtual Status CheckRequest(const IoRequest& request) const {
    (void)request;
    return Status::OK();
  }

  // Queues `requests`. May complete some synchronously. Fails only on invalid requests
  // (unknown file, misaligned direct request, more than the free queue slots would ever
  // allow is fine: the backend queues internally) — I/O errors arrive as completions.
  virtual Status Submit(std::span<const IoRequest> requests) = 0;

  // Waits until at least `min_complete` completions are available (fewer if fewer are in
  // flight), then moves up to out.size() of them into `out`. Returns how many were written.
  virtual Result<size_t> Poll(std::span<IoCompletion> out, size_t min_complete) = 0;

  // Requests submitted whose completion has not been returned by Poll yet.
  virtual size_t InFlight() const = 0;

  // Convenience: submit `requests`, wait for all, return the first failure (all are waited
  // for even after a failure). REQUIRES: nothing else in flight on this backend.
  Status RunSync(std::span<const IoRequest> requests);
};

// Makes a backend as `options` say. kAuto falls back to posix (one warning naming why)
// when io_uring cannot be set up (ENOSYS, EPERM, kernel.io_uring_disabled). kUring fails
// with NotSupported naming the reason when io_uring is unavailable.
Result<std::unique_ptr<IoBackend>> CreateIoBackend(const IoBackendOptions& options);

// Makes the backend for one submitting thread from the options it is given: where a user of
// backends takes one (EngineOptions::io_backend_factory) to put its own in place of
// CreateIoBackend's, e.g. FaultInjectionFactory (strata/fault_injection.h).
using IoBackendFactory =
    std::function<Result<std::unique_ptr<IoBackend>>(const IoBackendOptions& options)>;

// "auto" | "uring" | "posix" -> kind; InvalidArgument otherwise.
Result<IoBackendKind> ParseIoBackendKind(std::string_view name);
const char* IoBackendKindName(IoBackendKind kind);

}  // namespace strata
