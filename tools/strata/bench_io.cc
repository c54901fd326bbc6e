// `strata bench io`: bandwidth, IOPS and latency of the NVMe swap path, through the same
// IoBackend the engine uses, in the manner of fio and nccl-tests.
//
// Files (one per --path: several drives are striped, block k going to file k mod N) are
// preallocated, laid out with a seeded pattern, then read and written in blocks of --block
// bytes with --qd requests in flight. Every run checks its data: each 4 KiB sector carries a
// tag derived from (seed, file, offset) plus a seeded body, reads verify every sector as it
// arrives, and write runs are read back afterwards; #wrong counts blocks with any bad byte.
// Reads never come from the page cache: O_DIRECT, or with --no-direct fdatasync +
// posix_fadvise(DONTNEED) before each pass. --sweep tries block sizes × queue depths and
// prints the best setting as the engine's JSON.
//
// Run: strata bench io --path /nvme0 --path /nvme1 --size 4G --mode read --mode write
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "io/uring_backend.h"
#include "strata/bytes.h"
#include "strata/io.h"
#include "strata/status.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"

namespace strata::cli {
namespace {

constexpr uint64_t kSector = 4096;
constexpr uint64_t kTagBytes = 16;

enum class Mode { kRead, kWrite, kRandRead, kRandWrite };

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kRead:
      return "read";
    case Mode::kWrite:
      return "write";
    case Mode::kRandRead:
      return "randread";
    case Mode::kRandWrite:
      return "randwrite";
  }
  return "?";
}
bool IsWrite(Mode m) { return m == Mode::kWrite || m == Mode::kRandWrite; }
bool IsRandom(Mode m) { return m == Mode::kRandRead || m == Mode::kRandWrite; }

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

struct Flags {
  std::vector<std::string> paths;
  std::string size = "1G";
  std::string block = "1M";
  uint32_t qd = 32;
  std::vector<std::string> modes;
  std::string backend = "auto";
  bool direct = true;
  bool sqpoll = false;
  bool fixed_buffers = true;
  int iters = 3;
  int warmup = 1;
  bool sweep = false;
  bool json = false;
  uint64_t seed = 1;
};

struct RunResult {
  Mode mode;
  uint64_t block;
  uint32_t qd;
  uint64_t bytes = 0;
  double seconds = 0;
  double lat_p50_us = 0, lat_p99_us = 0;
  uint64_t wrong = 0;
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double iops() const { return seconds > 0 ? (bytes / block) / seconds : 0; }
};

// Page-aligned anonymous memory for the I/O buffers.
class Arena {
 public:
  ~Arena() {
    if (data_) ::munmap(data_, size_);
  }
  Status Map(size_t size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      return Status::FromErrno(errno, "mmap " + std::to_string(size) + " bytes of I/O buffers");
    }
    data_ = static_cast<char*>(p);
    size_ = size;
    return Status::OK();
  }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

class IoBench {
 public:
  explicit IoBench(const Flags& f) : flags_(f) {}
  ~IoBench() { RemoveFiles(); }

  // Validates the flags, checks free space and lays out the files. Nothing is written
  // before every check has passed.
  Status Setup(const std::vector<uint64_t>& blocks, const std::vector<uint32_t>& qds);
  // Runs `warmup` + `iters` passes of one case; the result covers the measured passes.
  Result<RunResult> Run(Mode mode, uint64_t block, uint32_t qd, int iters, int warmup);
  void PrintConfig(FILE* out) const;
  std::string backend_name() const { return backend_name_; }
  nlohmann::json ConfigJson() const;

 private:
  struct FileInfo {
    std::string path;
    int handle = -1;
    bool direct = false;
  };
  Result<std::unique_ptr<IoBackend>> MakeBackend(uint32_t qd);
  Status OpenFiles(IoBackend& b, std::vector<int>* handles);
  // One pass over every block. `latencies` gets one entry (us) per request.
  Status Pass(IoBackend& b, const std::vector<int>& handles, Mode mode, uint64_t block, uint32_t qd,
              uint64_t pass_seed, std::vector<float>* latencies, uint64_t* wrong);
  void Stamp(char* buf, uint64_t len, size_t file, uint64_t offset) const;
  bool Verify(const char* buf, uint64_t len, size_t file, uint64_t offset) const;
  Status DropCache(IoBackend& b, const std::vector<int>& handles);
  void RemoveFiles();

  Flags flags_;
  uint64_t total_ = 0;     // bytes per pass, all files
  uint64_t per_file_ = 0;  // bytes per file
  std::vector<FileInfo> files_;
  std::vector<std::string> created_;
  Arena arena_;
  std::vector<char> body_;  // the seeded sector body (kSector - kTagBytes bytes)
  IoBackendKind kind_ = IoBackendKind::kAuto;
  std::string backend_name_;
  uint32_t caps_ = 0;
  bool laid_out_ = false;
};

Status IoBench::Setup(const std::vector<uint64_t>& blocks, const std::vector<uint32_t>& qds) {
  if (flags_.paths.empty()) {
    return Status::InvalidArgument(
        "give at least one --path: a folder on the drive to measure (repeat --path to stripe "
        "over several drives)");
  }
  STRATA_ASSIGN_OR_RETURN(kind_, ParseIoBackendKind(flags_.backend));
  STRATA_ASSIGN_OR_RETURN(uint64_t size, ParseBytes("--size", flags_.size));
  uint64_t max_block = 0;
  for (uint64_t b : blocks) {
    if (b == 0) return Status::InvalidArgument("--block 0 is invalid; use e.g. 1M");
    if (flags_.direct && b % kIoAlignment != 0) {
      return Status::InvalidArgument("--block " + std::to_string(b) +
                                     " bytes is not a multiple of 4096, which O_DIRECT "
                                     "needs; use a multiple of 4K (e.g. 1M) or pass --no-direct");
    }
    if (b % kSector != 0) {
      return Status::InvalidArgument("--block " + std::to_string(b) +
                                     " bytes: the data check works in 4096-byte sectors; use a "
                                     "multiple of 4K");
    }
    max_block = std::max(max_block, b);
  }
  uint32_t max_qd = 0;
  for (uint32_t q : qds) {
    if (q == 0) {
      return Status::InvalidArgument(
          "--qd 0 is invalid: the queue depth is how many requests are in flight; use 1 or "
          "more (32 suits NVMe)");
    }
    max_qd = std::max(max_qd, q);
  }
  const uint64_t unit = max_block * flags_.paths.size();
  total_ = size / unit * unit;
  if (total_ == 0) {
    return Status::InvalidArgument("--size " + flags_.size + " is smaller than one block (" +
                                   std::to_string(max_block) +
                                   " bytes) per path; use a larger "
                                   "--size or a smaller --block");
  }
  per_file_ = total_ / flags_.paths.size();

  // Every path: exists, is a folder, has room. Checked for all before anything is written.
  std::vector<std::string> names;
  for (size_t i = 0; i < flags_.paths.size(); ++i) {
    const std::string& p = flags_.paths[i];
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
    if (::statvfs(p.c_str(), &vfs) == 0) {
      const uint64_t free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
      uint64_t needed = 0;
      for (size_t j = 0; j < flags_.paths.size(); ++j) {
        struct stat sj;
        if (::stat(flags_.paths[j].c_str(), &sj) == 0 && sj.st_dev == st.st_dev)
          needed += per_file_;
      }
      if (needed > free_bytes) {
        return Status::NoSpace("--path " + p + " has " + std::to_string(free_bytes) +
                               " bytes free (" + FormatBytes(free_bytes) +
                               "), but the benchmark needs " + std::to_string(needed) +
                               " bytes there; use a smaller --size or another --path")
            .WithPath(p);
      }
    }
    names.push_back((std::filesystem::path(p) /
                     ("strata_bench_io." + std::to_string(::getpid()) + "." + std::to_string(i)))
                        .string());
  }

  // The sector body: seeded bytes shared by every sector (the tag makes each sector unique).
  body_.resize(kSector - kTagBytes);
  std::mt19937_64 rng(flags_.seed);
  for (size_t i = 0; i < body_.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(body_.data() + i, &v, std::min<size_t>(8, body_.size() - i));
  }

  // Spare buffers beyond the queue depth: Pass() refills the queue before verifying
  // completed reads.
  STRATA_RETURN_IF_ERROR(arena_.Map(size_t(max_block) * (max_qd + SpareBuffers(max_qd))));
  // Sector bodies go into the buffers once; writes then only restamp the tags.
  for (uint64_t off = 0; off < arena_.size(); off += kSector) {
    std::memcpy(arena_.data() + off + kTagBytes, body_.data(), body_.size());
  }

  // Create and preallocate the files with the backend the runs will use.
  STRATA_ASSIGN_OR_RETURN(auto backend, MakeBackend(max_qd));
  backend_name_ = std::string(backend->Name());
  caps_ = backend->Capabilities();
  for (const std::string& name : names) {
    Result<int> h = backend->OpenFile(name, OpenOptions{.create = true, .direct = flags_.direct});
    if (!h.ok()) {
      Status s = h.status();
      return s.Annotate("--path " + std::filesystem::path(name).parent_path().string() +
                        " is not usable");
    }
    created_.push_back(name);
    FileInfo fi;
    fi.path = name;
    fi.direct = backend->IsDirect(*h);
    files_.push_back(fi);
    STRATA_RETURN_IF_ERROR(backend->Allocate(*h, per_file_));
    STRATA_RETURN_IF_ERROR(backend->CloseFile(*h));
  }
  return Status::OK();
}

Result<std::unique_ptr<IoBackend>> IoBench::MakeBackend(uint32_t qd) {
  IoBackendOptions o;
  o.kind = kind_;
  o.queue_depth = qd;
  o.direct = flags_.direct;
  o.fixed_buffers = flags_.fixed_buffers;
  o.fixed_files = true;
  o.sqpoll = flags_.sqpoll;
  Result<std::unique_ptr<IoBackend>> b = CreateIoBackend(o);
  if (!b.ok()) {
    Status s = b.status();
    return s.Annotate("--backend " + flags_.backend);
  }
  if (flags_.fixed_buffers) {
    BufferRegion r{arena_.data(), arena_.size()};
    STRATA_RETURN_IF_ERROR((*b)->RegisterBuffers({&r, 1}));
  }
  return b;
}

Status IoBench::OpenFiles(IoBackend& b, std::vector<int>* handles) {
  for (const FileInfo& f : files_) {
    STRATA_ASSIGN_OR_RETURN(int h, b.OpenFile(f.path, OpenOptions{.direct = flags_.direct}));
    handles->push_back(h);
  }
  return Status::OK();
}

void IoBench::Stamp(char* buf, uint64_t len, size_t file, uint64_t offset) const {
  for (uint64_t s = 0; s < len; s += kSector) {
    const uint64_t tag = Mix(flags_.seed ^ Mix((uint64_t(file) << 48) ^ (offset + s)));
    const uint64_t tags[2] = {tag, ~tag};
    std::memcpy(buf + s, tags, kTagBytes);
  }
}

bool IoBench::Verify(const char* buf, uint64_t len, size_t file, uint64_t offset) const {
  for (uint64_t s = 0; s < len; s += kSector) {
    const uint64_t tag = Mix(flags_.seed ^ Mix((uint64_t(file) << 48) ^ (offset + s)));
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

Status IoBench::Pass(IoBackend& b, const std::vector<int>& handles, Mode mode, uint64_t block,
                     uint32_t qd, uint64_t pass_seed, std::vector<float>* latencies,
                     uint64_t* wrong) {
  const uint64_t nblocks = total_ / block;
  const size_t nfiles = files_.size();
  std::vector<uint64_t> order(nblocks);
  std::iota(order.begin(), order.end(), 0);
  if (IsRandom(mode)) std::shuffle(order.begin(), order.end(), std::mt19937_64(pass_seed));
  const bool write = IsWrite(mode);
  const IoOp op = write ? IoOp::kWrite : IoOp::kRead;

  // Buffers are not tied to queue slots: there are qd + SpareBuffers(qd) of them, so the
  // queue is refilled to qd (resubmit first) while the blocks that just completed are still
  // being verified. Verifying 1 MiB takes the submitting thread tens of microseconds; done
  // before the resubmission it would leave those slots idle meanwhile.
  using Clock = std::chrono::steady_clock;
  const uint32_t nbufs = qd + SpareBuffers(qd);
  std::vector<Clock::time_point> started(nbufs);
  std::vector<uint64_t> buf_block(nbufs);
  std::vector<uint32_t> free_bufs(nbufs);
  std::iota(free_bufs.rbegin(), free_bufs.rend(), 0u);
  std::vector<uint32_t> to_verify;  // completed reads, buffers not yet checked
  to_verify.reserve(qd);
  auto verify_completed = [&] {
    for (uint32_t buf_index : to_verify) {
      const uint64_t k = buf_block[buf_index];
      if (!Verify(arena_.data() + uint64_t(buf_index) * block, block, k % nfiles,
                  (k / nfiles) * block)) {
        ++*wrong;
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
      char* buf = arena_.data() + uint64_t(buf_index) * block;
      if (write) Stamp(buf, block, file, off);
      buf_block[buf_index] = k;
      started[buf_index] = now;
      batch.push_back(IoRequest{op, handles[file], off, buf, block, buf_index});
    }
    if (!batch.empty()) STRATA_RETURN_IF_ERROR(b.Submit(batch));
    // The queue is full again; check what completed while the new requests run.
    verify_completed();
    if (b.InFlight() == 0) break;  // stopped early after an error
    STRATA_ASSIGN_OR_RETURN(size_t n, b.Poll(out, 1));
    const auto end = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      const auto buf_index = static_cast<uint32_t>(out[i].user_data);
      latencies->push_back(
          std::chrono::duration<float, std::micro>(end - started[buf_index]).count());
      if (!out[i].status.ok() && first_error.ok()) first_error = out[i].status;
      if (!write && out[i].status.ok()) {
        to_verify.push_back(buf_index);
      } else {
        free_bufs.push_back(buf_index);
      }
      ++done;
    }
  }
  verify_completed();  // the last completions: the loop ends once every block completed
  return first_error;
}

Result<RunResult> IoBench::Run(Mode mode, uint64_t block, uint32_t qd, int iters, int warmup) {
  STRATA_ASSIGN_OR_RETURN(auto backend, MakeBackend(qd));
  std::vector<int> handles;
  STRATA_RETURN_IF_ERROR(OpenFiles(*backend, &handles));
  std::vector<float> lat, scratch;
  uint64_t wrong = 0, ignored = 0;
  if (!IsWrite(mode) && !laid_out_) {
    // Reads need the pattern on disk: lay it out once, unmeasured.
    STRATA_RETURN_IF_ERROR(Pass(*backend, handles, Mode::kWrite, block, qd, 0, &scratch, &ignored));
    for (int h : handles) STRATA_RETURN_IF_ERROR(backend->Sync(h));
    laid_out_ = true;
  }
  RunResult r{mode, block, qd};
  for (int it = -warmup; it < iters; ++it) {
    if (!IsWrite(mode)) STRATA_RETURN_IF_ERROR(DropCache(*backend, handles));
    std::vector<float>* sink = it < 0 ? &scratch : &lat;
    uint64_t* wrong_sink = it < 0 ? &ignored : &wrong;
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(
        Pass(*backend, handles, mode, block, qd, flags_.seed + 1000 + it, sink, wrong_sink));
    if (IsWrite(mode)) {
      // Buffered writes only count once they are on the device.
      for (size_t i = 0; i < files_.size(); ++i) {
        if (!files_[i].direct) STRATA_RETURN_IF_ERROR(backend->Sync(handles[i]));
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it >= 0) {
      r.seconds += secs;
      r.bytes += total_;
    }
  }
  if (IsWrite(mode)) {
    // Check what the write runs left on disk (unmeasured).
    laid_out_ = true;
    STRATA_RETURN_IF_ERROR(DropCache(*backend, handles));
    STRATA_RETURN_IF_ERROR(Pass(*backend, handles, Mode::kRead, block, qd, 0, &scratch, &wrong));
  }
  r.wrong = wrong;
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    r.lat_p50_us = lat[lat.size() / 2];
    r.lat_p99_us = lat[std::min(lat.size() - 1, size_t(double(lat.size()) * 0.99))];
  }
  for (int h : handles) (void)backend->CloseFile(h);
  return r;
}

void IoBench::RemoveFiles() {
  for (const std::string& f : created_) ::unlink(f.c_str());
  created_.clear();
}

void IoBench::PrintConfig(FILE* out) const {
  std::fprintf(out, "# strata bench io\n");
  std::fprintf(
      out, "# backend: %s (requested %s); fixed buffers: %s, fixed files: %s, sqpoll: %s\n",
      backend_name_.c_str(), flags_.backend.c_str(), caps_ & kIoCapFixedBuffers ? "yes" : "no",
      caps_ & kIoCapFixedFiles ? "yes" : "no", caps_ & kIoCapSqpoll ? "yes" : "no");
  for (const FileInfo& f : files_) {
    std::fprintf(out, "# file: %s (%s, %s)\n", f.path.c_str(), FormatBytes(per_file_).c_str(),
                 f.direct ? "O_DIRECT" : "buffered; reads after fdatasync + fadvise(DONTNEED)");
  }
  std::fprintf(out, "# bytes per pass: %" PRIu64 " (%s), striped over %zu file(s) block by block\n",
               total_, FormatBytes(total_).c_str(), files_.size());
  std::fprintf(out,
               "# passes: %d warmup + %d measured per case; data seed %" PRIu64
               "; every block verified (#wrong)\n",
               flags_.warmup, flags_.iters, flags_.seed);
  std::fprintf(out, "# bw in GB/s = 1e9 bytes/s; latency from submission to completion\n#\n");
}

nlohmann::json IoBench::ConfigJson() const {
  nlohmann::json paths = nlohmann::json::array();
  for (const FileInfo& f : files_) paths.push_back({{"file", f.path}, {"direct", f.direct}});
  return {{"backend", backend_name_},
          {"files", paths},
          {"bytes_per_pass", total_},
          {"iters", flags_.iters},
          {"warmup", flags_.warmup},
          {"fixed_buffers", bool(caps_ & kIoCapFixedBuffers)},
          {"sqpoll", bool(caps_ & kIoCapSqpoll)},
          {"seed", flags_.seed}};
}

void PrintHeader() {
  std::printf("%10s %10s %4s %14s %9s %9s %10s %9s %9s %7s\n", "#mode", "block(B)", "qd", "bytes",
              "time(s)", "bw(GB/s)", "IOPS", "p50(us)", "p99(us)", "#wrong");
}
void PrintRow(const RunResult& r) {
  std::printf("%10s %10" PRIu64 " %4u %14" PRIu64 " %9.3f %9.3f %10.0f %9.1f %9.1f %7" PRIu64 "\n",
              ModeName(r.mode), r.block, r.qd, r.bytes, r.seconds, r.gbps(), r.iops(), r.lat_p50_us,
              r.lat_p99_us, r.wrong);
  std::fflush(stdout);
}
nlohmann::json RowJson(const RunResult& r) {
  return {{"mode", ModeName(r.mode)}, {"block_bytes", r.block},     {"queue_depth", r.qd},
          {"bytes", r.bytes},         {"seconds", r.seconds},       {"gbps", r.gbps()},
          {"iops", r.iops()},         {"lat_p50_us", r.lat_p50_us}, {"lat_p99_us", r.lat_p99_us},
          {"wrong", r.wrong}};
}

int RunBenchIo(const Flags& flags) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata bench io: error: %s\n", s.ToString().c_str());
    return 1;
  };
  std::vector<Mode> modes;
  for (const std::string& m :
       flags.modes.empty() ? std::vector<std::string>{"write", "read"} : flags.modes) {
    if (m == "read")
      modes.push_back(Mode::kRead);
    else if (m == "write")
      modes.push_back(Mode::kWrite);
    else if (m == "randread")
      modes.push_back(Mode::kRandRead);
    else if (m == "randwrite")
      modes.push_back(Mode::kRandWrite);
    else {
      return fail(Status::InvalidArgument("--mode " + m +
                                          " is not a mode; use read, write, randread or "
                                          "randwrite"));
    }
  }
  if (flags.iters < 1) return fail(Status::InvalidArgument("--iters must be at least 1"));
  if (flags.warmup < 0) return fail(Status::InvalidArgument("--warmup must be 0 or more"));
  Result<uint64_t> block = ParseBytes("--block", flags.block);
  if (!block.ok()) return fail(block.status());

  std::vector<uint64_t> blocks = {*block};
  std::vector<uint32_t> qds = {flags.qd};
  Flags f = flags;
  if (flags.sweep) {
    blocks = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    qds = {1, 4, 16, 64};
    // Seconds, not minutes: a small file and one measured pass per case.
    Result<uint64_t> size = ParseBytes("--size", flags.size);
    if (!size.ok()) return fail(size.status());
    if (*size > (256ull << 20)) f.size = "256M";
    f.iters = 1;
    f.warmup = 0;
  }
  IoBench bench(f);
  if (Status s = bench.Setup(blocks, qds); !s.ok()) return fail(s);
  if (!flags.json) {
    bench.PrintConfig(stdout);
    PrintHeader();
  }
  nlohmann::json runs = nlohmann::json::array();
  std::vector<RunResult> results;
  int rc = 0;
  for (uint64_t b : blocks) {
    for (uint32_t q : qds) {
      for (Mode m : modes) {
        Result<RunResult> r = bench.Run(m, b, q, f.iters, f.warmup);
        if (!r.ok()) return fail(r.status());
        if (r->wrong > 0) rc = 1;
        results.push_back(*r);
        runs.push_back(RowJson(*r));
        if (!flags.json) PrintRow(*r);
      }
    }
  }
  nlohmann::json doc = {{"runs", runs}, {"config", bench.ConfigJson()}};
  if (flags.sweep) {
    // Best setting: the one moving the most data per second across the swept modes
    // (harmonic combination: total bytes over total time, as a swap that reads and writes).
    double best = -1;
    uint64_t best_block = 0;
    uint32_t best_qd = 0;
    for (uint64_t b : blocks) {
      for (uint32_t q : qds) {
        double bytes = 0, secs = 0;
        for (const RunResult& r : results) {
          if (r.block == b && r.qd == q) bytes += double(r.bytes), secs += r.seconds;
        }
        const double bw = secs > 0 ? bytes / secs : 0;
        if (bw > best) best = bw, best_block = b, best_qd = q;
      }
    }
    nlohmann::json io = {
        {"io",
         {{"block_bytes", best_block},
          {"queue_depth", best_qd},
          {"backend", flags.backend == "auto"
                          ? std::string(bench.backend_name() == "posix" ? "posix" : "uring")
                          : flags.backend},
          {"direct", flags.direct}}}};
    doc["best"] = io;
    if (!flags.json) {
      std::string swept;
      for (Mode m : modes) swept += std::string(swept.empty() ? "" : "+") + ModeName(m);
      std::printf("# best: block %" PRIu64 " B, qd %u: %.3f GB/s over %s (bytes / time)\n",
                  best_block, best_qd, best / 1e9, swept.c_str());
      std::printf("%s\n", io.dump().c_str());
    }
  }
  if (flags.json) std::printf("%s\n", doc.dump(2).c_str());
  if (rc != 0) std::fprintf(stderr, "strata bench io: error: data check failed (#wrong > 0)\n");
  return rc;
}

}  // namespace

void AddBenchIo(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<Flags>();
  CLI::App* io = bench.add_subcommand(
      "io", "Bandwidth, IOPS and latency of the NVMe swap path (io_uring or pread/pwrite)");
  io->add_option("-p,--path", flags->paths,
                 "folder on a drive to measure; repeat for several drives (files are striped "
                 "over them block by block)");
  io->add_option("-s,--size", flags->size,
                 "bytes per pass over all paths, with K/M/G/T suffix (binary)")
      ->capture_default_str();
  io->add_option("-b,--block", flags->block,
                 "bytes per request (multiple of 4K with O_DIRECT), with K/M/G suffix")
      ->capture_default_str();
  io->add_option("-q,--qd", flags->qd, "queue depth: requests in flight")->capture_default_str();
  io->add_option("-m,--mode", flags->modes,
                 "read, write, randread or randwrite; repeat for several (default: write read)");
  io->add_option("--backend", flags->backend,
                 "I/O backend: auto (io_uring, else pread/pwrite), uring or posix")
      ->capture_default_str();
  io->add_flag("--direct,!--no-direct", flags->direct,
               "O_DIRECT (default); --no-direct uses the page cache, dropped before reads");
  io->add_flag("--sqpoll", flags->sqpoll, "io_uring kernel submission-queue polling thread");
  io->add_flag("--fixed-buffers,!--no-fixed-buffers", flags->fixed_buffers,
               "register the I/O buffers with io_uring (default on)");
  io->add_option("-i,--iters", flags->iters, "measured passes per case")->capture_default_str();
  io->add_option("-w,--warmup", flags->warmup, "unmeasured passes before them")
      ->capture_default_str();
  io->add_flag("--sweep", flags->sweep,
               "try block sizes 64K..4M x queue depths 1..64 on a small file (seconds) and "
               "print the best setting as the engine's JSON");
  io->add_option("--seed", flags->seed, "seed of the data pattern")->capture_default_str();
  io->add_flag("--json", flags->json, "print one JSON object instead of the table");
  io->callback([flags, exit_code] { *exit_code = RunBenchIo(*flags); });
}

}  // namespace strata::cli
