// One job of `strata bench io`; see io_bench.h.
#include "tools/strata/io_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

namespace strata::cli {
namespace {

constexpr uint64_t kSector = 4096;
constexpr uint64_t kTagBytes = 16;

// Buffers beyond the queue depth that hold completed reads while they are verified. A poll
// usually returns a few completions; 8 spares cover that without doubling the pinned arena
// of a deep queue (with fewer free buffers than completions the refill just waits for them).
uint32_t SpareBuffers(uint32_t qd) { return std::min<uint32_t>(qd, 8); }

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool IsRandom(IoMode m) {
  return m == IoMode::kRandRead || m == IoMode::kRandWrite || m == IoMode::kRandReadWrite;
}
bool IsMixed(IoMode m) { return m == IoMode::kReadWrite || m == IoMode::kRandReadWrite; }

// CPU time of the calling thread (user, system), in seconds.
std::pair<double, double> ThreadCpu() {
  struct rusage ru;
  if (::getrusage(RUSAGE_THREAD, &ru) != 0) return {0, 0};
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return {s(ru.ru_utime), s(ru.ru_stime)};
}

constexpr struct {
  IoMode mode;
  const char* name;
} kModes[] = {{IoMode::kRead, "read"},         {IoMode::kWrite, "write"},
              {IoMode::kRandRead, "randread"}, {IoMode::kRandWrite, "randwrite"},
              {IoMode::kReadWrite, "rw"},      {IoMode::kRandReadWrite, "randrw"}};

}  // namespace

const char* IoModeName(IoMode m) {
  for (const auto& e : kModes) {
    if (e.mode == m) return e.name;
  }
  return "?";
}

Result<IoMode> ParseIoMode(const std::string& name) {
  for (const auto& e : kModes) {
    if (name == e.name) return e.mode;
  }
  return Status::InvalidArgument("--mode " + name +
                                 " is not a mode; use read, write, randread, randwrite, rw or "
                                 "randrw (rw/randrw mix reads and writes by --rwmixread)");
}

bool ModeWrites(IoMode m) { return m != IoMode::kRead && m != IoMode::kRandRead; }

std::string HumanBytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " GiB", b >> 30);
  } else if (b >= (1ull << 20) && b % (1ull << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " MiB", b >> 20);
  } else if (b >= 1024 && b % 1024 == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " KiB", b >> 10);
  } else if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(b) / double(1ull << 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  }
  return buf;
}

Status IoBench::Setup(uint64_t max_block, uint32_t max_qd) {
  const uint64_t unit = max_block * o_.paths.size();
  total_ = o_.bytes / unit * unit;
  if (total_ == 0) {
    return Status::InvalidArgument("--size " + std::to_string(o_.bytes) +
                                   " bytes is smaller than one block (" + HumanBytes(max_block) +
                                   ") per path; use a larger --size or a smaller --block");
  }
  per_file_ = total_ / o_.paths.size();

  // Every path: exists, is a folder, has room for every job. Checked for all before
  // anything is written.
  std::vector<std::string> names;
  for (size_t i = 0; i < o_.paths.size(); ++i) {
    const std::string& p = o_.paths[i];
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) {
      return Status::FromErrno(errno, "--path " + p +
                                          " cannot be used (create the folder "
                                          "first or pick another)")
          .WithPath(p);
    }
    if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument("--path " + p +
                                     " is not a folder; give the folder in "
                                     "which the benchmark may create its files")
          .WithPath(p);
    }
    struct statvfs vfs;
    if (o_.job == 0 && ::statvfs(p.c_str(), &vfs) == 0) {
      const uint64_t free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
      uint64_t needed = 0;
      for (size_t j = 0; j < o_.paths.size(); ++j) {
        struct stat sj;
        if (::stat(o_.paths[j].c_str(), &sj) == 0 && sj.st_dev == st.st_dev) {
          needed += per_file_ * static_cast<uint64_t>(o_.jobs);
        }
      }
      if (needed > free_bytes) {
        return Status::NoSpace("--path " + p + " has " + std::to_string(free_bytes) +
                               " bytes free (" + HumanBytes(free_bytes) +
                               "), but the benchmark needs " + std::to_string(needed) +
                               " bytes there; use a smaller --size, fewer --numjobs or another "
                               "--path")
            .WithPath(p);
      }
    }
    names.push_back(
        (std::filesystem::path(p) / ("strata_bench_io." + std::to_string(::getpid()) + "." +
                                     std::to_string(o_.job) + "." + std::to_string(i)))
            .string());
  }

  // The sector body: seeded bytes shared by every sector (the tag makes each sector unique).
  body_.resize(kSector - kTagBytes);
  std::mt19937_64 rng(o_.seed);
  for (size_t i = 0; i < body_.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(body_.data() + i, &v, std::min<size_t>(8, body_.size() - i));
  }

  // Spare buffers beyond the queue depth: Pass() refills the queue before verifying
  // completed reads.
  const size_t arena = size_t(max_block) * (max_qd + SpareBuffers(max_qd));
  void* mem = ::mmap(nullptr, arena, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) {
    return Status::FromErrno(errno, "mmap " + std::to_string(arena) +
                                        " bytes of I/O buffers (--block x --qd); use a smaller "
                                        "--block or --qd");
  }
  arena_ = static_cast<char*>(mem);
  arena_size_ = arena;
  // Sector bodies go into the buffers once; writes then only restamp the tags.
  for (uint64_t off = 0; off < arena_size_; off += kSector) {
    std::memcpy(arena_ + off + kTagBytes, body_.data(), body_.size());
  }

  // Create and preallocate the files with the backend the runs will use.
  STRATA_ASSIGN_OR_RETURN(auto backend, MakeBackend(max_qd));
  backend_name_ = std::string(backend->Name());
  caps_ = backend->Capabilities();
  for (const std::string& name : names) {
    // A new file (O_EXCL, never through a link): nothing already at the name, whoever put it
    // there, is written or later removed.
    Result<int> h = backend->OpenFile(
        name,
        OpenOptions{.create = true, .direct = o_.direct, .no_follow = true, .exclusive = true});
    if (!h.ok()) {
      Status s = h.status();
      return s.Annotate("--path " + std::filesystem::path(name).parent_path().string() +
                        " is not usable");
    }
    created_.push_back(name);
    files_.push_back({name, backend->IsDirect(*h)});
    STRATA_RETURN_IF_ERROR(backend->Allocate(*h, per_file_));
    STRATA_RETURN_IF_ERROR(backend->CloseFile(*h));
  }
  return Status::OK();
}

Result<std::unique_ptr<IoBackend>> IoBench::MakeBackend(uint32_t qd) {
  IoBackendOptions o;
  o.kind = o_.backend;
  o.queue_depth = qd;
  o.direct = o_.direct;
  o.fixed_buffers = o_.fixed_buffers;
  o.fixed_files = true;
  o.sqpoll = o_.sqpoll;
  Result<std::unique_ptr<IoBackend>> b = CreateIoBackend(o);
  if (!b.ok()) {
    Status s = b.status();
    return s.Annotate("--backend " + o_.backend_flag);
  }
  if (o_.fixed_buffers) {
    BufferRegion r{arena_, arena_size_};
    STRATA_RETURN_IF_ERROR((*b)->RegisterBuffers({&r, 1}));
  }
  return b;
}

Status IoBench::OpenFiles(IoBackend& b, std::vector<int>* handles) {
  for (const FileInfo& f : files_) {
    STRATA_ASSIGN_OR_RETURN(int h, b.OpenFile(f.path, OpenOptions{.direct = o_.direct}));
    handles->push_back(h);
  }
  return Status::OK();
}

void IoBench::Stamp(char* buf, uint64_t len, size_t file, uint64_t offset) const {
  for (uint64_t s = 0; s < len; s += kSector) {
    const uint64_t tag =
        Mix(o_.seed ^ Mix((uint64_t(o_.job) << 56) ^ (uint64_t(file) << 48) ^ (offset + s)));
    const uint64_t tags[2] = {tag, ~tag};
    std::memcpy(buf + s, tags, kTagBytes);
  }
}

bool IoBench::Verify(const char* buf, uint64_t len, size_t file, uint64_t offset) const {
  for (uint64_t s = 0; s < len; s += kSector) {
    const uint64_t tag =
        Mix(o_.seed ^ Mix((uint64_t(o_.job) << 56) ^ (uint64_t(file) << 48) ^ (offset + s)));
    const uint64_t tags[2] = {tag, ~tag};
    if (std::memcmp(buf + s, tags, kTagBytes) != 0) return false;
    if (std::memcmp(buf + s + kTagBytes, body_.data(), body_.size()) != 0) return false;
  }
  return true;
}

Status IoBench::DropCache(IoBackend& b, const std::vector<int>& handles) {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].direct) continue;
    STRATA_RETURN_IF_ERROR(b.Sync(handles[i]));
    // The backend owns its descriptors; a second one reaches the same page cache.
    const int fd = ::open(files_[i].path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + files_[i].path);
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (rc != 0) return Status::FromErrno(rc, "posix_fadvise(DONTNEED) " + files_[i].path);
  }
  return Status::OK();
}

Status IoBench::Pass(IoBackend& b, const std::vector<int>& handles, IoMode mode, uint64_t block,
                     uint32_t qd, uint64_t pass_seed, IoJobResult* into) {
  const uint64_t nblocks = total_ / block;
  const size_t nfiles = files_.size();
  std::vector<uint64_t> order(nblocks);
  std::iota(order.begin(), order.end(), 0);
  if (IsRandom(mode)) std::shuffle(order.begin(), order.end(), std::mt19937_64(pass_seed));
  // Which requests write: all, none, or (rw, randrw) each with probability 1 - rwmixread%.
  std::vector<bool> writes(nblocks, ModeWrites(mode));
  if (IsMixed(mode)) {
    std::mt19937_64 rng(Mix(pass_seed) ^ 0x5eed);
    std::bernoulli_distribution read(o_.rwmixread / 100.0);
    for (uint64_t k = 0; k < nblocks; ++k) writes[k] = !read(rng);
  }

  // Buffers are not tied to queue slots: there are qd + SpareBuffers(qd) of them, so the
  // queue is refilled to qd (resubmit first) while the blocks that just completed are still
  // being verified. Verifying 1 MiB takes the submitting thread tens of microseconds; done
  // before the resubmission it would leave those slots idle meanwhile.
  using Clock = std::chrono::steady_clock;
  const uint32_t nbufs = qd + SpareBuffers(qd);
  std::vector<Clock::time_point> started(nbufs);
  std::vector<uint64_t> buf_block(nbufs), order_of(nbufs);  // block, its index in `order`
  std::vector<uint32_t> free_bufs(nbufs);
  std::iota(free_bufs.rbegin(), free_bufs.rend(), 0u);
  std::vector<uint32_t> to_verify;  // completed reads, buffers not yet checked
  to_verify.reserve(qd);
  auto verify_completed = [&] {
    for (uint32_t buf_index : to_verify) {
      const uint64_t k = buf_block[buf_index];
      if (!Verify(arena_ + uint64_t(buf_index) * block, block, k % nfiles, (k / nfiles) * block)) {
        ++into->wrong;
      }
      free_bufs.push_back(buf_index);
    }
    to_verify.clear();
  };
  std::vector<IoRequest> batch;
  batch.reserve(qd);
  std::vector<IoCompletion> out(qd);
  uint64_t next = 0, done = 0;
  Status first_error;
  while (done < nblocks) {
    batch.clear();
    const auto now = Clock::now();
    while (next < nblocks && b.InFlight() + batch.size() < qd && !free_bufs.empty() &&
           first_error.ok()) {
      const uint32_t buf_index = free_bufs.back();
      free_bufs.pop_back();
      const uint64_t k = order[next++];
      const size_t file = k % nfiles;
      const uint64_t off = (k / nfiles) * block;
      char* buf = arena_ + uint64_t(buf_index) * block;
      const bool write = writes[next - 1];
      if (write) Stamp(buf, block, file, off);
      if (!write) into->bytes_read += block;
      buf_block[buf_index] = k;
      order_of[buf_index] = next - 1;
      started[buf_index] = now;
      batch.push_back(
          IoRequest{write ? IoOp::kWrite : IoOp::kRead, handles[file], off, buf, block, buf_index});
    }
    if (!batch.empty()) STRATA_RETURN_IF_ERROR(b.Submit(batch));
    // The queue is full again; check what completed while the new requests run.
    verify_completed();
    if (b.InFlight() == 0) break;  // stopped early after an error
    STRATA_ASSIGN_OR_RETURN(size_t n, b.Poll(out, 1));
    const auto end = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      const auto buf_index = static_cast<uint32_t>(out[i].user_data);
      into->latencies_us.push_back(
          std::chrono::duration<float, std::micro>(end - started[buf_index]).count());
      if (!out[i].status.ok() && first_error.ok()) first_error = out[i].status;
      if (!writes[order_of[buf_index]] && out[i].status.ok()) {
        to_verify.push_back(buf_index);
      } else {
        free_bufs.push_back(buf_index);
      }
      ++done;
      ++into->requests;
    }
  }
  verify_completed();  // the last completions: the loop ends once every block completed
  return first_error;
}

Result<IoJobResult> IoBench::Run(const IoCase& c) {
  STRATA_ASSIGN_OR_RETURN(auto backend, MakeBackend(c.qd));
  std::vector<int> handles;
  STRATA_RETURN_IF_ERROR(OpenFiles(*backend, &handles));
  IoJobResult scratch;
  if (!laid_out_ && c.mode != IoMode::kWrite && c.mode != IoMode::kRandWrite) {
    // Reads need the pattern on disk: lay it out once, unmeasured.
    STRATA_RETURN_IF_ERROR(Pass(*backend, handles, IoMode::kWrite, c.block, c.qd, 0, &scratch));
    for (int h : handles) STRATA_RETURN_IF_ERROR(backend->Sync(h));
    laid_out_ = true;
  }
  IoJobResult r;
  using Clock = std::chrono::steady_clock;
  // Warm-up passes (it < 0), then measured ones: --iters of them, or as many as fit in
  // --runtime (at least one).
  for (int it = -c.warmup;; ++it) {
    if (c.interrupted && c.interrupted()) return Status::Aborted("interrupted");
    if (it == 0 && c.before_measured) c.before_measured();
    if (it >= 0 && (c.runtime_s > 0 ? r.seconds >= c.runtime_s : it >= c.iters)) break;
    if (!ModeWrites(c.mode) || IsMixed(c.mode)) {
      STRATA_RETURN_IF_ERROR(DropCache(*backend, handles));
    }
    IoJobResult* sink = it < 0 ? &scratch : &r;
    const auto cpu0 = ThreadCpu();
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(
        Pass(*backend, handles, c.mode, c.block, c.qd, o_.seed + 1000 + it, sink));
    if (ModeWrites(c.mode)) {
      // Buffered writes only count once they are on the device.
      for (size_t i = 0; i < files_.size(); ++i) {
        if (!files_[i].direct) STRATA_RETURN_IF_ERROR(backend->Sync(handles[i]));
      }
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto cpu1 = ThreadCpu();
    if (it >= 0) {
      r.seconds += secs;
      r.bytes += total_;
      r.usr_s += cpu1.first - cpu0.first;
      r.sys_s += cpu1.second - cpu0.second;
    }
  }
  if (ModeWrites(c.mode)) {
    // Check what the runs that write left on disk (unmeasured).
    laid_out_ = true;
    STRATA_RETURN_IF_ERROR(DropCache(*backend, handles));
    IoJobResult check;
    STRATA_RETURN_IF_ERROR(Pass(*backend, handles, IoMode::kRead, c.block, c.qd, 0, &check));
    r.wrong += check.wrong;
  }
  for (int h : handles) (void)backend->CloseFile(h);
  return r;
}

void IoBench::RemoveFiles() {
  for (const std::string& f : created_) ::unlink(f.c_str());
  created_.clear();
  if (arena_ != nullptr) ::munmap(arena_, arena_size_);
  arena_ = nullptr;
}

}  // namespace strata::cli
