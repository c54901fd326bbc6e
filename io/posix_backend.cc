#include "io/posix_backend.h"

#include <sched.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace strata {

using io_internal::FileEntry;

#if defined(__SANITIZE_THREAD__)
// Under ThreadSanitizer the tasks run on plain threads: oneTBB is not instrumented, so TSan
// cannot see it hand a task to a worker and would report (and, with tests/tsan.supp, suppress
// at great cost) every buffer access of every task. Same interface as the TBB pool below.
struct PosixBackend::Pool {
  struct Arena {
    template <class F>
    void execute(F&& f) {
      f();
    }
  };
  struct Group {
    explicit Group(int threads) {
      for (int i = 0; i < threads; ++i) workers.emplace_back([this] { Work(); });
    }
    ~Group() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (std::thread& t : workers) t.join();
    }
    void run(std::function<void()> task) {
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(std::move(task));
        ++pending;
      }
      cv.notify_one();
    }
    void wait() {
      std::unique_lock<std::mutex> lock(mu);
      idle.wait(lock, [this] { return pending == 0; });
    }
    void Work() {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [this] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop, and nothing left
        std::function<void()> task = std::move(queue.front());
        queue.pop_front();
        lock.unlock();
        task();
        lock.lock();
        if (--pending == 0) idle.notify_all();
      }
    }
    std::mutex mu;
    std::condition_variable cv, idle;
    std::deque<std::function<void()>> queue;
    size_t pending = 0;
    bool stop = false;
    std::vector<std::thread> workers;
  };
  explicit Pool(int threads) : group(threads) {}
  ~Pool() { group.wait(); }
  Arena arena;
  Group group;
};
#else
struct PosixBackend::Pool {
  explicit Pool(int threads)
      // The workers block in pread/pwrite, so they may outnumber the cores; the ceiling is
      // raised to fit them plus the thread that waits. No slot is reserved for the caller,
      // who only enqueues and later waits.
      : control(tbb::global_control::max_allowed_parallelism,
                std::max<size_t>(
                    tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism),
                    static_cast<size_t>(threads) + 1)),
        arena(threads, 0) {}
  ~Pool() {
    arena.execute([this] { group.wait(); });
  }
  tbb::global_control control;
  tbb::task_arena arena;
  tbb::task_group group;
};
#endif

Result<std::unique_ptr<PosixBackend>> PosixBackend::Create(const IoBackendOptions& options) {
  if (options.queue_depth == 0) {
    return Status::InvalidArgument(
        "I/O queue depth 0 is invalid: at least one request must be in flight; use 1 or more "
        "(32 is a good default for NVMe)");
  }
  return std::unique_ptr<PosixBackend>(new PosixBackend(options));
}

PosixBackend::PosixBackend(const IoBackendOptions& options) : options_(options) {
  const uint32_t threads = options.posix_threads ? options.posix_threads : options.queue_depth;
  pool_ = std::make_unique<Pool>(static_cast<int>(std::min<uint32_t>(threads, 256)));
}

PosixBackend::~PosixBackend() {
  pool_.reset();  // waits for every task
  for (auto& f : files_) {
    if (f && f->entry.fd >= 0) ::close(f->entry.fd);
  }
}

uint32_t PosixBackend::Capabilities() const {
  return kIoCapAsync | (options_.direct ? kIoCapDirect : 0u);
}

const PosixBackend::File* PosixBackend::Lookup(int file) const {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) return nullptr;
  return files_[file].get();
}
PosixBackend::File* PosixBackend::Lookup(int file) {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) return nullptr;
  return files_[file].get();
}

Result<int> PosixBackend::OpenFile(const std::string& path, const OpenOptions& options) {
  STRATA_ASSIGN_OR_RETURN(FileEntry entry,
                          io_internal::OpenFileEntry(path, options, options_.direct));
  auto f = std::make_shared<File>();
  f->entry = std::move(entry);
  for (size_t i = 0; i < files_.size(); ++i) {
    if (!files_[i]) {
      files_[i] = std::move(f);
      return static_cast<int>(i);
    }
  }
  files_.push_back(std::move(f));
  return static_cast<int>(files_.size() - 1);
}

Status PosixBackend::CloseFile(int file) {
  File* f = Lookup(file);
  if (f == nullptr) {
    return Status::InvalidArgument("CloseFile: handle " + std::to_string(file) + " is not open");
  }
  if (f->pending.load() != 0) {
    return Status::InvalidArgument("CloseFile: " + f->entry.path + " still has " +
                                   std::to_string(f->pending.load()) +
                                   " requests in flight; Poll them first")
        .WithPath(f->entry.path);
  }
  const int rc = ::close(f->entry.fd);
  const int err = errno;
  std::string path = f->entry.path;
  files_[file].reset();
  if (rc != 0 && err != EINTR) return Status::FromErrno(err, "close " + path).WithPath(path);
  return Status::OK();
}

bool PosixBackend::IsDirect(int file) const {
  const File* f = Lookup(file);
  return f != nullptr && f->entry.direct;
}

Status PosixBackend::Allocate(int file, uint64_t bytes) {
  File* f = Lookup(file);
  if (f == nullptr) return Status::InvalidArgument("Allocate: handle is not open");
  return io_internal::AllocateFile(f->entry, bytes);
}

Status PosixBackend::Sync(int file) {
  File* f = Lookup(file);
  if (f == nullptr) return Status::InvalidArgument("Sync: handle is not open");
  return io_internal::SyncFile(f->entry);
}

Status PosixBackend::Transfer(const IoRequest& r, const FileEntry& f) {
  auto* p = static_cast<char*>(r.buffer);
  uint64_t done = 0;
  int zero_writes = 0;
  while (done < r.length) {
    // Linux moves at most ~2 GiB per call; larger requests loop like short transfers.
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(r.length - done, 1ull << 30));
    const off_t off = static_cast<off_t>(r.offset + done);
    const ssize_t n = r.op == IoOp::kRead ? ::pread(f.fd, p + done, chunk, off)
                                          : ::pwrite(f.fd, p + done, chunk, off);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        sched_yield();
        continue;
      }
      return io_internal::TransferError(errno, r.op, f, r.offset + done, r.length - done);
    }
    if (n == 0) {
      if (r.op == IoOp::kRead) return io_internal::EndOfFileError(f, r.offset, r.length, done);
      // A write that moves nothing and reports no error: retry a few times, then give up
      // rather than spin forever.
      if (++zero_writes > 8) return io_internal::TransferError(EIO, r.op, f, off, r.length - done);
      continue;
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

void PosixBackend::Complete(IoCompletion c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(c));
  }
  cv_.notify_one();
}

Status PosixBackend::CheckRequest(const IoRequest& r) const {
  const File* f = Lookup(r.file);
  return io_internal::ValidateRequest(r, f ? &f->entry : nullptr);
}

Status PosixBackend::Submit(std::span<const IoRequest> requests) {
  // Validate the whole batch first so that a bad request queues nothing.
  for (const IoRequest& r : requests) {
    const File* f = Lookup(r.file);
    STRATA_RETURN_IF_ERROR(io_internal::ValidateRequest(r, f ? &f->entry : nullptr));
  }
  pool_->arena.execute([&] {
    for (const IoRequest& r : requests) {
      std::shared_ptr<File> f = files_[r.file];
      ++in_flight_;
      if (r.length == 0) {
        Complete(IoCompletion{r.user_data, Status::OK()});
        continue;
      }
      f->pending.fetch_add(1);
      pool_->group.run([this, r, f] {
        Status s;
        try {
          s = Transfer(r, f->entry);
        } catch (const std::exception& e) {
          s = Status::IOError(std::string("posix I/O task failed: ") + e.what())
                  .WithPath(f->entry.path)
                  .WithOffset(r.offset);
        }
        f->pending.fetch_sub(1);
        Complete(IoCompletion{r.user_data, std::move(s)});
      });
    }
  });
  return Status::OK();
}

Result<size_t> PosixBackend::Poll(std::span<IoCompletion> out, size_t min_complete) {
  const size_t want = std::min({min_complete, in_flight_, out.size()});
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_.size() >= want; });
  const size_t n = std::min(out.size(), done_.size());
  for (size_t i = 0; i < n; ++i) {
    out[i] = std::move(done_.front());
    done_.pop_front();
  }
  in_flight_ -= n;
  return n;
}

}  // namespace strata
