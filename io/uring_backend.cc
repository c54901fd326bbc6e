// The io_uring completion loop
// ===========================
//
// Overview. A request the caller submits becomes an Op. Ops wait in `pending_` until an
// SQ slot is free; FillQueue() moves as many as fit (at most queue_depth, the ring's size)
// into SQEs — READ_FIXED/WRITE_FIXED when the buffer lies wholly inside a registered
// region, IOSQE_FIXED_FILE when the file has a slot in the registered table — and one
// io_uring_submit()/io_uring_submit_and_wait() hands the whole batch to the kernel with a
// single system call. ReapAvailable() then takes completions in batches with
// io_uring_peek_batch_cqe() and advances the CQ once per batch ("fill the queue to its
// depth, submit once, reap many").
//
// Lifecycle of an Op: Submit() validates and appends it to `pending_` (and `in_flight_`
// counts it) -> FillQueue() gives it a slot of `slots_` (the SQE's user_data is the slot
// index, so no allocation per request) -> the kernel completes it -> ReapAvailable()
// either finishes it (pushes an IoCompletion onto `ready_` and frees the slot) or requeues
// it at the FRONT of `pending_` so a retried remainder does not wait behind new work ->
// Poll() moves finished completions to the caller and only then is the Op out of flight.
// Poll() refills the SQ after reaping so the device never idles while work is queued.
//
// Error handling. Submit() refuses a bad batch as a whole (InvalidArgument: unknown file,
// misaligned O_DIRECT request, write to a read-only file) before queueing any of it. A
// negative cqe->res other than -EAGAIN/-EINTR finishes the Op with a status carrying the
// errno, path and offset of the failed remainder (ENOSPC -> NoSpace). Errors of the ring
// itself (io_uring_enter failing with anything but EINTR/EAGAIN/EBUSY) are returned by
// Poll as IOError. Nothing is retried forever: -EAGAIN gives up after kMaxEagain
// consecutive results, a write that moves 0 bytes after kMaxZeroWrites.
//
// Partial I/O. cqe->res may be short (a signal, a device limit, end of file). `done`
// advances by res and the Op is requeued for the rest, so the caller only ever sees "all
// bytes moved" or an error. A read that returns 0 before `length` is end of file: an
// IOError naming how many bytes were read. Each SQE moves at most 1 GiB (the SQE length is
// 32 bits); larger requests proceed like short transfers.
//
// Concurrency. None inside: one ring per instance, one instance per submitting thread, and
// that thread reaps its own completions (no completion thread, no locks). With SQPOLL the
// kernel's poller thread consumes the SQ; liburing's submit wakes it when it sleeps.
#include "io/uring_backend.h"

#include <liburing.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "strata/log.h"

namespace strata {

using io_internal::FileEntry;

namespace {

constexpr uint64_t kMaxSqeBytes = 1ull << 30;  // per SQE, and per registered buffer
constexpr uint32_t kMaxEagain = 100000;        // consecutive -EAGAIN before giving up
constexpr uint32_t kMaxZeroWrites = 8;         // writes moving 0 bytes before giving up
constexpr uint32_t kMaxFixedFiles = 256;       // sparse registered-file table size
constexpr unsigned kReapBatch = 64;

std::string ReadSysctl(const char* path) {
  std::ifstream in(path);
  std::string v;
  if (in) std::getline(in, v);
  return v;
}

uint64_t MemlockLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur;
}

Status RingSetupError(int err, bool sqpoll) {
  const std::string disabled = ReadSysctl("/proc/sys/kernel/io_uring_disabled");
  std::string why;
  switch (err) {
    case ENOSYS:
      why = "io_uring is not available: this kernel has no io_uring (ENOSYS)";
      break;
    case EPERM:
      why = "io_uring is not permitted for this process (EPERM";
      if (!disabled.empty()) why += "; kernel.io_uring_disabled=" + disabled;
      why += "; a seccomp or container policy may also block it)";
      if (sqpoll) why += "; SQPOLL may need CAP_SYS_NICE on this kernel";
      break;
    case ENOMEM:
      why = "io_uring could not allocate its ring (ENOMEM; RLIMIT_MEMLOCK is " +
            std::to_string(MemlockLimit()) + " bytes; raise it with ulimit -l)";
      break;
    case EINVAL:
      why = std::string("io_uring rejected the ring setup (EINVAL") +
            (sqpoll ? "; this kernel may not support SQPOLL as asked)" : ")");
      break;
    default:
      why = std::string("io_uring setup failed: ") + std::strerror(err);
  }
  return Status::NotSupported(why).WithErrno(err);
}

}  // namespace

Result<std::unique_ptr<UringBackend>> UringBackend::Create(const IoBackendOptions& options) {
  if (options.queue_depth == 0) {
    return Status::InvalidArgument(
        "I/O queue depth 0 is invalid: at least one request must be in flight; use 1 or more "
        "(32 is a good default for NVMe)");
  }
  if (options.queue_depth > 4096) {
    return Status::InvalidArgument("I/O queue depth " + std::to_string(options.queue_depth) +
                                   " is larger than io_uring's 4096 entries; use at most 4096");
  }
  std::unique_ptr<UringBackend> b(new UringBackend(options));
  STRATA_RETURN_IF_ERROR(b->Init());
  return b;
}

UringBackend::UringBackend(const IoBackendOptions& options)
    : options_(options), ring_(std::make_unique<io_uring>()) {}

Status UringBackend::Init() {
  if (ReadSysctl("/proc/sys/kernel/io_uring_disabled") == "2") {
    return Status::NotSupported(
               "io_uring is disabled on this machine (kernel.io_uring_disabled=2; "
               "`sysctl kernel.io_uring_disabled=0` enables it)")
        .WithErrno(EPERM);
  }
  io_uring_params params;
  std::memset(&params, 0, sizeof(params));
  if (options_.sqpoll) {
    params.flags |= IORING_SETUP_SQPOLL;
    params.sq_thread_idle = 1000;  // ms the poller spins before sleeping
  }
  const int rc = io_uring_queue_init_params(options_.queue_depth, ring_.get(), &params);
  if (rc < 0) return RingSetupError(-rc, options_.sqpoll);
  ring_ready_ = true;

  if (options_.fixed_files) {
    struct rlimit rl;
    uint32_t n = kMaxFixedFiles;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < n) {
      n = static_cast<uint32_t>(rl.rlim_cur / 2);
    }
    if (n > 0 && io_uring_register_files_sparse(ring_.get(), n) == 0) {
      fixed_files_ = true;
      file_table_size_ = n;
    } else {
      LogDebug("io_uring: registered file table unavailable; using plain file descriptors");
    }
  }
  slots_.resize(options_.queue_depth);
  free_slots_.reserve(options_.queue_depth);
  for (uint32_t i = options_.queue_depth; i > 0; --i) free_slots_.push_back(i - 1);
  return Status::OK();
}

UringBackend::~UringBackend() {
  if (ring_ready_) {
    DrainKernel();
    io_uring_queue_exit(ring_.get());
  }
  for (File& f : files_) {
    if (f.entry.fd >= 0) ::close(f.entry.fd);
  }
}

uint32_t UringBackend::Capabilities() const {
  uint32_t caps = kIoCapAsync;
  if (options_.direct) caps |= kIoCapDirect;
  if (options_.fixed_buffers && !warned_register_) caps |= kIoCapFixedBuffers;
  if (fixed_files_) caps |= kIoCapFixedFiles;
  if (options_.sqpoll) caps |= kIoCapSqpoll;
  return caps;
}

UringBackend::File* UringBackend::Lookup(int file) {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) return nullptr;
  File* f = &files_[file];
  return f->entry.fd >= 0 ? f : nullptr;
}
const UringBackend::File* UringBackend::Lookup(int file) const {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) return nullptr;
  const File* f = &files_[file];
  return f->entry.fd >= 0 ? f : nullptr;
}

Result<int> UringBackend::OpenFile(const std::string& path, const OpenOptions& options) {
  STRATA_ASSIGN_OR_RETURN(FileEntry entry,
                          io_internal::OpenFileEntry(path, options, options_.direct));
  size_t handle = files_.size();
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].entry.fd < 0) {
      handle = i;
      break;
    }
  }
  if (handle == files_.size()) files_.emplace_back();
  File& f = files_[handle];
  f = File{};
  f.entry = std::move(entry);
  if (fixed_files_) {
    std::vector<bool> used(file_table_size_, false);
    for (const File& o : files_) {
      if (o.entry.fd >= 0 && o.fixed_slot >= 0) used[o.fixed_slot] = true;
    }
    for (uint32_t s = 0; s < file_table_size_; ++s) {
      if (used[s]) continue;
      int fd = f.entry.fd;
      if (io_uring_register_files_update(ring_.get(), s, &fd, 1) == 1) f.fixed_slot = int(s);
      break;
    }
  }
  return static_cast<int>(handle);
}

Status UringBackend::CloseFile(int file) {
  File* f = Lookup(file);
  if (f == nullptr) {
    return Status::InvalidArgument("CloseFile: handle " + std::to_string(file) + " is not open");
  }
  if (f->pending != 0) {
    return Status::InvalidArgument("CloseFile: " + f->entry.path + " still has " +
                                   std::to_string(f->pending) +
                                   " requests in flight; Poll them first")
        .WithPath(f->entry.path);
  }
  if (f->fixed_slot >= 0) {
    int none = -1;
    (void)io_uring_register_files_update(ring_.get(), f->fixed_slot, &none, 1);
  }
  const int rc = ::close(f->entry.fd);
  const int err = errno;
  std::string path = f->entry.path;
  *f = File{};
  if (rc != 0 && err != EINTR) return Status::FromErrno(err, "close " + path).WithPath(path);
  return Status::OK();
}

bool UringBackend::IsDirect(int file) const {
  const File* f = Lookup(file);
  return f != nullptr && f->entry.direct;
}

Status UringBackend::Allocate(int file, uint64_t bytes) {
  File* f = Lookup(file);
  if (f == nullptr) return Status::InvalidArgument("Allocate: handle is not open");
  return io_internal::AllocateFile(f->entry, bytes);
}

Status UringBackend::Sync(int file) {
  File* f = Lookup(file);
  if (f == nullptr) return Status::InvalidArgument("Sync: handle is not open");
  return io_internal::SyncFile(f->entry);
}

Status UringBackend::RegisterBuffers(std::span<const BufferRegion> regions) {
  if (!options_.fixed_buffers || regions.empty()) return Status::OK();
  if (in_flight_ != 0) {
    return Status::InvalidArgument("RegisterBuffers: " + std::to_string(in_flight_) +
                                   " requests are in flight; register buffers while idle");
  }
  std::vector<BufferRegion> all = registered_;
  for (const BufferRegion& r : regions) {
    if (r.data == nullptr || r.size == 0) {
      return Status::InvalidArgument("RegisterBuffers: a region is empty or has a null address");
    }
    for (size_t off = 0; off < r.size; off += kMaxSqeBytes) {
      all.push_back(
          BufferRegion{static_cast<char*>(r.data) + off,
                       static_cast<size_t>(std::min<uint64_t>(kMaxSqeBytes, r.size - off))});
    }
  }
  if (fixed_buffers_) {
    (void)io_uring_unregister_buffers(ring_.get());
    fixed_buffers_ = false;
    regions_.clear();
  }
  std::vector<iovec> iov(all.size());
  uint64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    iov[i].iov_base = all[i].data;
    iov[i].iov_len = all[i].size;
    total += all[i].size;
  }
  const int rc = io_uring_register_buffers(ring_.get(), iov.data(), unsigned(iov.size()));
  if (rc < 0) {
    registered_.clear();
    if (!warned_register_) {
      LogWarning("io_uring: cannot register " + std::to_string(total) + " bytes of I/O buffers (" +
                 std::strerror(-rc) + "; RLIMIT_MEMLOCK is " + std::to_string(MemlockLimit()) +
                 " bytes, raise it with ulimit -l); continuing with unregistered buffers, "
                 "which costs a page pin per request");
    }
    warned_register_ = true;
    return Status::OK();
  }
  registered_ = std::move(all);
  fixed_buffers_ = true;
  regions_.clear();
  for (size_t i = 0; i < registered_.size(); ++i) {
    const auto b = reinterpret_cast<uintptr_t>(registered_[i].data);
    regions_.push_back(Region{b, b + registered_[i].size, int(i)});
  }
  std::sort(regions_.begin(), regions_.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  return Status::OK();
}

int UringBackend::FindRegion(const void* buffer, uint64_t length) const {
  if (!fixed_buffers_ || regions_.empty() || length == 0) return -1;
  const auto addr = reinterpret_cast<uintptr_t>(buffer);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), addr,
                             [](uintptr_t a, const Region& r) { return a < r.begin; });
  // Regions may overlap; look back over every region that starts at or before addr.
  while (it != regions_.begin()) {
    --it;
    if (addr + length <= it->end) return it->index;
    if (it->end - it->begin >= kMaxSqeBytes) break;  // an earlier one cannot reach further
  }
  return -1;
}

Status UringBackend::CheckRequest(const IoRequest& r) const {
  const File* f = Lookup(r.file);
  return io_internal::ValidateRequest(r, f ? &f->entry : nullptr);
}

Status UringBackend::Submit(std::span<const IoRequest> requests) {
  for (const IoRequest& r : requests) {
    const File* f = Lookup(r.file);
    STRATA_RETURN_IF_ERROR(io_internal::ValidateRequest(r, f ? &f->entry : nullptr));
  }
  for (const IoRequest& r : requests) {
    ++in_flight_;
    if (r.length == 0) {
      ready_.push_back(IoCompletion{r.user_data, Status::OK()});
      continue;
    }
    Op op;
    op.req = r;
    op.buf_index = FindRegion(r.buffer, r.length);
    files_[r.file].pending++;
    pending_.push_back(op);
  }
  if (FillQueue() > 0) {
    const int rc = io_uring_submit(ring_.get());
    // EAGAIN/EBUSY: the kernel is short of resources or the CQ is full; the SQEs stay in
    // the ring and the next Poll submits them.
    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR) {
      return Status::FromErrno(-rc, "io_uring_submit");
    }
  }
  return Status::OK();
}

unsigned UringBackend::FillQueue() {
  unsigned n = 0;
  while (!pending_.empty() && !free_slots_.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    if (sqe == nullptr) break;
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    Op& op = slots_[slot];
    op = std::move(pending_.front());
    pending_.pop_front();

    const File& f = files_[op.req.file];
    const uint64_t chunk = std::min(op.req.length - op.done, kMaxSqeBytes);
    void* buf = static_cast<char*>(op.req.buffer) + op.done;
    const uint64_t off = op.req.offset + op.done;
    const int fd = f.fixed_slot >= 0 ? f.fixed_slot : f.entry.fd;
    const unsigned len = static_cast<unsigned>(chunk);
    if (op.buf_index >= 0) {
      if (op.req.op == IoOp::kRead) {
        io_uring_prep_read_fixed(sqe, fd, buf, len, off, op.buf_index);
      } else {
        io_uring_prep_write_fixed(sqe, fd, buf, len, off, op.buf_index);
      }
      ++fixed_buffer_ops_;
    } else {
      if (op.req.op == IoOp::kRead) {
        io_uring_prep_read(sqe, fd, buf, len, off);
      } else {
        io_uring_prep_write(sqe, fd, buf, len, off);
      }
    }
    if (f.fixed_slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, slot);
    ++in_kernel_;
    ++n;
  }
  return n;
}

void UringBackend::Finish(uint32_t slot, Status status) {
  Op& op = slots_[slot];
  files_[op.req.file].pending--;
  ready_.push_back(IoCompletion{op.req.user_data, std::move(status)});
  free_slots_.push_back(slot);
}

unsigned UringBackend::ReapAvailable() {
  unsigned total = 0;
  io_uring_cqe* cqes[kReapBatch];
  for (;;) {
    const unsigned n = io_uring_peek_batch_cqe(ring_.get(), cqes, kReapBatch);
    if (n == 0) break;
    for (unsigned i = 0; i < n; ++i) {
      const auto slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqes[i]));
      const int res = cqes[i]->res;
      --in_kernel_;
      Op& op = slots_[slot];
      const FileEntry& f = files_[op.req.file].entry;
      auto requeue = [&] {
        ++requeues_;
        pending_.push_front(std::move(op));
        free_slots_.push_back(slot);
      };
      if (res < 0) {
        const int err = -res;
        if ((err == EAGAIN || err == EINTR) && ++op.eagain < kMaxEagain) {
          requeue();
        } else {
          Finish(slot, io_internal::TransferError(err, op.req.op, f, op.req.offset + op.done,
                                                  op.req.length - op.done));
        }
        continue;
      }
      op.eagain = 0;
      if (res == 0) {
        if (op.req.op == IoOp::kRead) {
          Finish(slot, io_internal::EndOfFileError(f, op.req.offset, op.req.length, op.done));
        } else if (++op.zero_writes > kMaxZeroWrites) {
          Finish(slot, io_internal::TransferError(EIO, op.req.op, f, op.req.offset + op.done,
                                                  op.req.length - op.done));
        } else {
          requeue();
        }
        continue;
      }
      op.done += static_cast<uint64_t>(res);
      if (op.done >= op.req.length) {
        Finish(slot, Status::OK());
      } else {
        requeue();  // short transfer: the rest goes back to the head of the queue
      }
    }
    io_uring_cq_advance(ring_.get(), n);
    total += n;
  }
  return total;
}

Result<size_t> UringBackend::Poll(std::span<IoCompletion> out, size_t min_complete) {
  const size_t want = std::min({min_complete, in_flight_, out.size()});
  ReapAvailable();
  while (ready_.size() < want) {
    FillQueue();
    if (in_kernel_ == 0 && !pending_.empty() && options_.sqpoll) {
      // SQPOLL: the kernel thread can post the completions of a batch (buffered I/O
      // completes inline) before it publishes the SQ head that frees their entries, so
      // everything may be reaped while the SQ still looks full. Wait for the space.
      const int rc = io_uring_sqring_wait(ring_.get());
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
        return Status::FromErrno(-rc, "io_uring_sqring_wait");
      }
      continue;
    }
    if (in_kernel_ == 0) {
      return Status::IOError("io_uring backend lost track of " +
                             std::to_string(want - ready_.size()) + " requests (internal error)");
    }
    const unsigned wait_nr =
        static_cast<unsigned>(std::min<size_t>(want - ready_.size(), in_kernel_));
    const int rc = io_uring_submit_and_wait(ring_.get(), wait_nr);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
      return Status::FromErrno(-rc, "io_uring_submit_and_wait");
    }
    ReapAvailable();
  }
  // Keep the device busy: whatever was freed above is refilled before returning.
  if (FillQueue() > 0) (void)io_uring_submit(ring_.get());

  const size_t n = std::min(out.size(), ready_.size());
  for (size_t i = 0; i < n; ++i) {
    out[i] = std::move(ready_.front());
    ready_.pop_front();
  }
  in_flight_ -= n;
  return n;
}

void UringBackend::DrainKernel() {
  while (in_kernel_ > 0) {
    const int rc = io_uring_submit_and_wait(ring_.get(), 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) break;
    ReapAvailable();
  }
}

}  // namespace strata
