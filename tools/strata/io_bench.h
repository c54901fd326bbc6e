// One job of `strata bench io`: its files (one per --path, blocks striped over them), its
// I/O buffers and the passes it runs over them through an IoBackend, with every byte
// checked. bench_io.cc runs --numjobs of these side by side and reports them.
//
// Data check: each 4 KiB sector carries a tag derived from (seed, job, file, offset) and a
// seeded body, so a sector's content depends only on where it is, never on the pass or the
// mode; reads verify every sector as it arrives, and runs that write are read back
// afterwards; `wrong` counts blocks with any bad byte. Reads never come from the page cache:
// O_DIRECT, or (--no-direct) fdatasync + posix_fadvise(DONTNEED) before each pass.
//
// An IoBench is driven by one thread at a time; jobs share nothing, so each may run on its
// own thread. Files are removed when the object is destroyed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/io.h"
#include "strata/status.h"

namespace strata::cli {

// read/write: sequential; rand*: a seeded shuffle of the blocks per pass; rw/randrw: each
// request a read with probability rwmixread %, else a write.
enum class IoMode { kRead, kWrite, kRandRead, kRandWrite, kReadWrite, kRandReadWrite };
const char* IoModeName(IoMode m);
// InvalidArgument naming --mode and the accepted names.
Result<IoMode> ParseIoMode(const std::string& name);
bool ModeWrites(IoMode m);  // write, randwrite, rw, randrw

// "4 KiB", "1 MiB", "1.5 GiB", "512 B": a byte count with binary units.
std::string HumanBytes(uint64_t b);

struct IoJobOptions {
  std::vector<std::string> paths;  // --path folders
  uint64_t bytes = 0;              // per pass, over all paths (whole blocks per path)
  IoBackendKind backend = IoBackendKind::kAuto;
  std::string backend_flag = "auto";  // for messages
  bool direct = true, sqpoll = false, fixed_buffers = true;
  uint64_t seed = 1;
  int job = 0;         // index among --numjobs (names its files and seeds its pattern)
  int jobs = 1;        // how many share the paths (for the free-space check)
  int rwmixread = 50;  // percent of reads in rw/randrw
};

struct IoCase {
  IoMode mode = IoMode::kRead;
  uint64_t block = 0;
  uint32_t qd = 0;
  int iters = 1, warmup = 0;
  double runtime_s = 0;  // > 0: measured passes go on until this much time has passed
  // Called once before the first measured pass (after the warm-up), e.g. a barrier that
  // starts all jobs' measurements together. May be empty.
  std::function<void()> before_measured;
  // Asked before each pass: true stops the case with Aborted (SIGINT/SIGTERM), the files
  // still removed when the IoBench is destroyed. May be empty.
  std::function<bool()> interrupted;
};

struct IoJobResult {
  uint64_t bytes = 0, bytes_read = 0;  // measured passes; bytes - bytes_read were written
  uint64_t requests = 0;
  double seconds = 0;               // wall time of the measured passes
  double usr_s = 0, sys_s = 0;      // CPU time of the driving thread meanwhile
  std::vector<float> latencies_us;  // one per request, submission to completion
  uint64_t wrong = 0;               // blocks that failed the data check
};

class IoBench {
 public:
  explicit IoBench(IoJobOptions options) : o_(std::move(options)) {}
  ~IoBench() { RemoveFiles(); }
  IoBench(const IoBench&) = delete;
  IoBench& operator=(const IoBench&) = delete;

  // Checks the paths (folders, free space for every job), maps buffers for the largest
  // block x deepest queue, and creates and preallocates the files. Nothing is written
  // before every check has passed. Errors name the flag: --path, --size, --block, --qd,
  // --backend.
  Status Setup(uint64_t max_block, uint32_t max_qd);
  // Runs `c.warmup` unmeasured then the measured passes of one case.
  Result<IoJobResult> Run(const IoCase& c);

  uint64_t bytes_per_pass() const { return total_; }
  const std::string& backend_name() const { return backend_name_; }
  uint32_t capabilities() const { return caps_; }
  struct FileInfo {
    std::string path;
    bool direct = false;
  };
  const std::vector<FileInfo>& files() const { return files_; }

 private:
  Result<std::unique_ptr<IoBackend>> MakeBackend(uint32_t qd);
  Status OpenFiles(IoBackend& b, std::vector<int>* handles);
  // One pass over every block; appends one latency (us) per request and counts reads.
  Status Pass(IoBackend& b, const std::vector<int>& handles, IoMode mode, uint64_t block,
              uint32_t qd, uint64_t pass_seed, IoJobResult* into);
  void Stamp(char* buf, uint64_t len, size_t file, uint64_t offset) const;
  bool Verify(const char* buf, uint64_t len, size_t file, uint64_t offset) const;
  Status DropCache(IoBackend& b, const std::vector<int>& handles);
  void RemoveFiles();

  IoJobOptions o_;
  uint64_t total_ = 0;     // bytes per pass, all files
  uint64_t per_file_ = 0;  // bytes per file
  std::vector<FileInfo> files_;
  std::vector<std::string> created_;
  char* arena_ = nullptr;  // page-aligned I/O buffers (mmap)
  size_t arena_size_ = 0;
  std::vector<char> body_;  // the seeded sector body (kSector - kTagBytes bytes)
  std::string backend_name_;
  uint32_t caps_ = 0;
  bool laid_out_ = false;
};

}  // namespace strata::cli
