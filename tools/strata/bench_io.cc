// `strata bench io`: bandwidth, IOPS, latency and CPU cost of the NVMe swap path, through
// the same IoBackend the engine uses, in the manner of fio and nccl-tests.
//
// --numjobs jobs (io_bench.h), each with its own files (one per --path: several drives are
// striped, block k going to file k mod N) and its own thread and queue, run every case
// side by side; their measured passes start together. Every block is checked (#wrong).
// --sweep tries block sizes x queue depths in rounds, after a warm-up round, until the best
// setting has stayed the same for three rounds (or --sweep-rounds ran out), prints the
// spread of each setting over the rounds and writes the best as --io-config FILE.
//
// Run: strata bench io --path /nvme0 --path /nvme1 --size 4G --mode read --mode write
#include <algorithm>
#include <barrier>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/bench_stats.h"
#include "strata/io.h"
#include "strata/status.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/interrupt.h"
#include "tools/strata/io_bench.h"

namespace strata::cli {
namespace {

constexpr double kPercentiles[] = {1, 5, 10, 20, 50, 80, 90, 95, 99, 99.9, 99.99};

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
  double runtime = 0;
  int numjobs = 1;
  int rwmixread = 50;
  bool sweep = false;
  int sweep_rounds = 8;
  std::string json, io_config;
  uint64_t seed = 1;
};

struct Latency {
  double mean = 0, stdev = 0, min = 0, max = 0;
  std::vector<double> pct;  // at kPercentiles
};

// Nearest-rank percentiles of `lat` (sorted here).
Latency Summarize(std::vector<float>& lat) {
  Latency l;
  if (lat.empty()) return l;
  std::sort(lat.begin(), lat.end());
  double sum = 0, sq = 0;
  for (float x : lat) sum += x;
  l.mean = sum / double(lat.size());
  for (float x : lat) sq += (x - l.mean) * (x - l.mean);
  l.stdev = lat.size() > 1 ? std::sqrt(sq / double(lat.size() - 1)) : 0;
  l.min = lat.front();
  l.max = lat.back();
  for (double p : kPercentiles) {
    const double rank = std::ceil(p / 100.0 * double(lat.size()));
    l.pct.push_back(lat[std::clamp<size_t>(size_t(rank), 1, lat.size()) - 1]);
  }
  return l;
}

// One case over all jobs.
struct CaseResult {
  IoMode mode = IoMode::kRead;
  uint64_t block = 0;
  uint32_t qd = 0;
  int jobs = 1;
  uint64_t bytes = 0, bytes_read = 0, requests = 0, wrong = 0;
  double seconds = 0;  // the longest job's measured time: the jobs start together
  double usr_s = 0, sys_s = 0;
  Latency lat;
  double mbps() const { return seconds > 0 ? double(bytes) / seconds / 1e6 : 0; }
  double mibps() const { return seconds > 0 ? double(bytes) / seconds / (1 << 20) : 0; }
  double iops() const { return seconds > 0 ? double(requests) / seconds : 0; }
  double usr_pct() const { return seconds > 0 ? 100 * usr_s / seconds : 0; }
  double sys_pct() const { return seconds > 0 ? 100 * sys_s / seconds : 0; }
};

// The jobs of a run, set up once and driven case by case.
class JobSet {
 public:
  Status Setup(const Flags& f, IoBackendKind kind, uint64_t bytes, uint64_t max_block,
               uint32_t max_qd) {
    for (int j = 0; j < f.numjobs; ++j) {
      IoJobOptions o{.paths = f.paths,
                     .bytes = bytes,
                     .backend = kind,
                     .backend_flag = f.backend,
                     .direct = f.direct,
                     .sqpoll = f.sqpoll,
                     .fixed_buffers = f.fixed_buffers,
                     .seed = f.seed,
                     .job = j,
                     .jobs = f.numjobs,
                     .rwmixread = f.rwmixread};
      jobs_.push_back(std::make_unique<IoBench>(o));
      STRATA_RETURN_IF_ERROR(jobs_.back()->Setup(max_block, max_qd));
    }
    return Status::OK();
  }

  Result<CaseResult> Run(const IoCase& c) {
    const size_t n = jobs_.size();
    // The jobs' measured passes start together; a job that fails before it gets there
    // drops out of the barrier so that the others do not wait for it.
    std::barrier start(static_cast<std::ptrdiff_t>(n));
    std::vector<Result<IoJobResult>> results(n, Status::Aborted("not run"));
    auto run_job = [&](size_t j) {
      bool arrived = false;
      IoCase mine = c;
      mine.interrupted = [] { return InterruptSignal() != 0; };
      mine.before_measured = [&] {
        arrived = true;
        start.arrive_and_wait();
      };
      results[j] = jobs_[j]->Run(mine);
      if (!arrived) start.arrive_and_drop();
    };
    std::vector<std::thread> threads;
    for (size_t j = 1; j < n; ++j) threads.emplace_back(run_job, j);
    run_job(0);
    for (auto& t : threads) t.join();
    CaseResult r;
    r.mode = c.mode;
    r.block = c.block;
    r.qd = c.qd;
    r.jobs = static_cast<int>(n);
    std::vector<float> lat;
    for (auto& jr : results) {
      if (!jr.ok()) return jr.status();
      r.bytes += jr->bytes;
      r.bytes_read += jr->bytes_read;
      r.requests += jr->requests;
      r.wrong += jr->wrong;
      r.seconds = std::max(r.seconds, jr->seconds);
      r.usr_s += jr->usr_s;
      r.sys_s += jr->sys_s;
      lat.insert(lat.end(), jr->latencies_us.begin(), jr->latencies_us.end());
    }
    r.lat = Summarize(lat);
    return r;
  }

  const IoBench& first() const { return *jobs_.front(); }

 private:
  std::vector<std::unique_ptr<IoBench>> jobs_;
};

std::string Compact(uint64_t bytes) {  // "1MiB": HumanBytes without the space, for columns
  std::string s = HumanBytes(bytes);
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

void PrintConfig(FILE* out, const Flags& f, const JobSet& jobs) {
  const IoBench& b = jobs.first();
  const uint32_t caps = b.capabilities();
  std::fprintf(out, "# strata bench io\n");
  std::fprintf(
      out, "# backend: %s (requested %s); fixed buffers: %s, fixed files: %s, sqpoll: %s\n",
      b.backend_name().c_str(), f.backend.c_str(), caps & kIoCapFixedBuffers ? "yes" : "no",
      caps & kIoCapFixedFiles ? "yes" : "no", caps & kIoCapSqpoll ? "yes" : "no");
  for (const auto& file : b.files()) {
    std::fprintf(out, "# file: %s (%s, %s)%s\n", file.path.c_str(),
                 HumanBytes(b.bytes_per_pass() / b.files().size()).c_str(),
                 file.direct ? "O_DIRECT" : "buffered; reads after fdatasync + fadvise(DONTNEED)",
                 f.numjobs > 1 ? " and the same for each job" : "");
  }
  std::fprintf(out,
               "# bytes per pass: %" PRIu64
               " (%s) per job, %d job(s), striped over %zu file(s) "
               "block by block; rw/randrw: %d%% reads\n",
               b.bytes_per_pass(), HumanBytes(b.bytes_per_pass()).c_str(), f.numjobs,
               b.files().size(), f.rwmixread);
  if (f.runtime > 0) {
    std::fprintf(out, "# passes: %d warmup, then measured ones for %.1f s per case", f.warmup,
                 f.runtime);
  } else {
    std::fprintf(out, "# passes: %d warmup + %d measured per case", f.warmup, f.iters);
  }
  std::fprintf(out, "; data seed %" PRIu64 "; every block verified (#wrong)\n", f.seed);
  std::fprintf(out,
               "# MB/s = 1e6 bytes/s, MiB/s = 2^20 bytes/s; latency from submission to "
               "completion; usr/sys: CPU time of the submitting threads over wall time\n#\n");
}

void PrintHeader(FILE* out) {
  std::fprintf(out, "%10s %7s %4s %4s %12s %8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %6s %6s %6s\n",
               "#mode", "block", "qd", "jobs", "bytes", "time(s)", "MB/s", "MiB/s", "IOPS",
               "mean(us)", "stdev(us)", "min(us)", "p50(us)", "p99(us)", "max(us)", "usr%", "sys%",
               "#wrong");
}

void PrintRow(FILE* out, const CaseResult& r) {
  std::fprintf(
      out,
      "%10s %7s %4u %4d %12" PRIu64
      " %8.3f %9.1f %9.1f %9.0f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %6.1f %6.1f %6" PRIu64 "\n",
      IoModeName(r.mode), Compact(r.block).c_str(), r.qd, r.jobs, r.bytes, r.seconds, r.mbps(),
      r.mibps(), r.iops(), r.lat.mean, r.lat.stdev, r.lat.min, r.lat.pct.empty() ? 0 : r.lat.pct[4],
      r.lat.pct.empty() ? 0 : r.lat.pct[8], r.lat.max, r.usr_pct(), r.sys_pct(), r.wrong);
  std::fflush(out);
}

void PrintPercentiles(FILE* out, const std::vector<CaseResult>& rows) {
  std::fprintf(out, "# latency percentiles (us):\n");
  for (const CaseResult& r : rows) {
    std::string line = "#   " + std::string(IoModeName(r.mode)) + " " + Compact(r.block) + " qd " +
                       std::to_string(r.qd) + ":";
    char buf[48];
    for (size_t i = 0; i < r.lat.pct.size(); ++i) {
      std::snprintf(buf, sizeof buf, " p%g %.1f", kPercentiles[i], r.lat.pct[i]);
      line += buf;
    }
    std::fprintf(out, "%s\n", line.c_str());
  }
}

nlohmann::json RowJson(const CaseResult& r) {
  nlohmann::json pct = nlohmann::json::object();
  for (size_t i = 0; i < r.lat.pct.size(); ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "p%g", kPercentiles[i]);
    pct[key] = r.lat.pct[i];
  }
  return {{"mode", IoModeName(r.mode)},
          {"block_bytes", r.block},
          {"queue_depth", r.qd},
          {"jobs", r.jobs},
          {"bytes", r.bytes},
          {"bytes_read", r.bytes_read},
          {"bytes_written", r.bytes - r.bytes_read},
          {"requests", r.requests},
          {"seconds", r.seconds},
          {"MBps", r.mbps()},
          {"MiBps", r.mibps()},
          {"iops", r.iops()},
          {"lat_us",
           {{"mean", r.lat.mean},
            {"stdev", r.lat.stdev},
            {"min", r.lat.min},
            {"max", r.lat.max},
            {"percentiles", pct}}},
          {"cpu_usr_pct", r.usr_pct()},
          {"cpu_sys_pct", r.sys_pct()},
          {"wrong", r.wrong}};
}

// The sweep's settings and, per setting, the bandwidth of each round (bytes over time
// across the swept modes, as a swap that reads and writes).
struct Setting {
  uint64_t block;
  uint32_t qd;
  std::vector<double> mbps;  // one per round
  double Median() const { return model::Median(mbps); }
  double Min() const { return mbps.empty() ? 0 : *std::min_element(mbps.begin(), mbps.end()); }
  double Max() const { return mbps.empty() ? 0 : *std::max_element(mbps.begin(), mbps.end()); }
};

size_t Best(const std::vector<Setting>& s) {
  size_t best = 0;
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i].Median() > s[best].Median()) best = i;
  }
  return best;
}

struct SweepOutcome {
  std::vector<Setting> settings;
  std::vector<CaseResult> rows;  // the last round's cases
  int rounds = 0;
  bool stable = false;
};

// A warm-up round (unmeasured passes), then measured rounds of one pass per case until the
// best setting by median has been the same after three rounds in a row.
Result<SweepOutcome> Sweep(JobSet& jobs, const Flags& f, const std::vector<IoMode>& modes,
                           FILE* out) {
  SweepOutcome s;
  for (uint64_t b : {64ull << 10, 256ull << 10, 1ull << 20, 4ull << 20}) {
    for (uint32_t q : {1u, 4u, 16u, 64u}) s.settings.push_back({b, q, {}});
  }
  size_t same = 0, last_best = SIZE_MAX;
  for (int round = 0; round < f.sweep_rounds && !s.stable; ++round) {
    s.rows.clear();
    for (Setting& st : s.settings) {
      double bytes = 0, secs = 0;
      for (IoMode m : modes) {
        IoCase c;
        c.mode = m;
        c.block = st.block;
        c.qd = st.qd;
        c.warmup = round == 0 ? 1 : 0;  // iters 1
        STRATA_ASSIGN_OR_RETURN(CaseResult r, jobs.Run(c));
        bytes += double(r.bytes);
        secs += r.seconds;
        s.rows.push_back(r);
      }
      st.mbps.push_back(secs > 0 ? bytes / secs / 1e6 : 0);
    }
    s.rounds = round + 1;
    const size_t best = Best(s.settings);
    same = best == last_best ? same + 1 : 1;
    last_best = best;
    s.stable = same >= 3;
    std::fprintf(out, "# sweep round %d: best so far %s qd %u (median %.1f MB/s)\n", s.rounds,
                 Compact(s.settings[best].block).c_str(), s.settings[best].qd,
                 s.settings[best].Median());
  }
  return s;
}

nlohmann::json SweepJson(const SweepOutcome& s, const Flags& f, const std::string& backend) {
  nlohmann::json settings = nlohmann::json::array();
  for (const Setting& st : s.settings) {
    settings.push_back({{"block_bytes", st.block},
                        {"queue_depth", st.qd},
                        {"median_MBps", st.Median()},
                        {"min_MBps", st.Min()},
                        {"max_MBps", st.Max()},
                        {"MBps_per_round", st.mbps}});
  }
  const Setting& b = s.settings[Best(s.settings)];
  return {{"rounds", s.rounds},
          {"stable", s.stable},
          {"settings", settings},
          {"io",
           {{"block_bytes", b.block},
            {"queue_depth", b.qd},
            {"backend",
             f.backend == "auto" ? std::string(backend == "posix" ? "posix" : "uring") : f.backend},
            {"direct", f.direct}}}};
}

// Prints each setting's spread and the choice, with how far the runner-up is.
void PrintSweep(FILE* out, const SweepOutcome& s) {
  std::fprintf(out, "#\n# sweep: %d round(s), %s\n", s.rounds,
               s.stable ? "the best setting stayed the same for the last 3"
                        : "NOT stable: the best setting still changed (raise --sweep-rounds or "
                          "--size)");
  std::fprintf(out, "# %7s %4s %12s %12s %12s\n", "block", "qd", "median(MB/s)", "min(MB/s)",
               "max(MB/s)");
  for (const Setting& st : s.settings) {
    std::fprintf(out, "# %7s %4u %12.1f %12.1f %12.1f\n", Compact(st.block).c_str(), st.qd,
                 st.Median(), st.Min(), st.Max());
  }
  const size_t best = Best(s.settings);
  size_t second = best == 0 ? 1 : 0;
  for (size_t i = 0; i < s.settings.size(); ++i) {
    if (i != best && s.settings[i].Median() > s.settings[second].Median()) second = i;
  }
  const Setting &b = s.settings[best], &r = s.settings[second];
  std::fprintf(out,
               "# best: block %s, qd %u: median %.1f MB/s (%.1f..%.1f); runner-up %s qd %u: "
               "%.1f MB/s%s\n",
               HumanBytes(b.block).c_str(), b.qd, b.Median(), b.Min(), b.Max(),
               HumanBytes(r.block).c_str(), r.qd, r.Median(),
               r.Max() >= b.Min() ? " (within the spread: either is as good)" : "");
}

Status CheckFlags(const Flags& f, uint64_t block) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (f.paths.empty()) {
    return bad(
        "give at least one --path: a folder on the drive to measure (repeat --path to stripe "
        "over several drives)");
  }
  if (block == 0) return bad("--block 0 is invalid; use e.g. 1M");
  if (f.direct && block % kIoAlignment != 0) {
    return bad("--block " + std::to_string(block) +
               " bytes is not a multiple of 4096, which O_DIRECT needs; use a multiple of 4K "
               "(e.g. 1M) or pass --no-direct");
  }
  if (block % 4096 != 0) {
    return bad("--block " + std::to_string(block) +
               " bytes: the data check works in 4096-byte sectors; use a multiple of 4K");
  }
  if (f.qd == 0) {
    return bad(
        "--qd 0 is invalid: the queue depth is how many requests are in flight; use 1 or more "
        "(32 suits NVMe)");
  }
  if (f.iters < 1) return bad("--iters must be at least 1");
  if (f.warmup < 0) return bad("--warmup must be 0 or more");
  if (f.numjobs < 1) return bad("--numjobs must be at least 1");
  if (f.rwmixread < 0 || f.rwmixread > 100) return bad("--rwmixread is a percentage: 0..100");
  if (!(f.runtime >= 0)) return bad("--runtime must be 0 (off) or a number of seconds");
  if (f.sweep_rounds < 1) return bad("--sweep-rounds must be at least 1");
  if (!f.io_config.empty() && !f.sweep) {
    return bad("--io-config FILE is written by --sweep; add --sweep");
  }
  return Status::OK();
}

int RunBenchIo(const Flags& flags) {
  // The first SIGINT or SIGTERM stops the run after the pass in flight; returning destroys
  // the jobs, which removes their data files (a second signal kills at once).
  InstallInterruptHandlers();
  auto fail = [](const Status& s) {
    if (const int sig = InterruptSignal(); sig != 0) {
      std::fprintf(stderr, "strata bench io: interrupted by %s; its data files are removed\n",
                   InterruptName(sig));
      return InterruptExitCode(sig);
    }
    std::fprintf(stderr, "strata bench io: error: %s\n", s.ToString().c_str());
    return 1;
  };
  // With --json -, standard output carries only the JSON; the table goes to standard error.
  FILE* const out = flags.json == "-" ? stderr : stdout;
  std::vector<IoMode> modes;
  for (const std::string& m :
       flags.modes.empty() ? std::vector<std::string>{"write", "read"} : flags.modes) {
    Result<IoMode> mode = ParseIoMode(m);
    if (!mode.ok()) return fail(mode.status());
    modes.push_back(*mode);
  }
  Result<uint64_t> block = ParseBytes("--block", flags.block);
  if (!block.ok()) return fail(block.status());
  Result<uint64_t> size = ParseBytes("--size", flags.size);
  if (!size.ok()) return fail(size.status());
  if (Status s = CheckFlags(flags, *block); !s.ok()) return fail(s);
  // The outputs are checked before the run, not after minutes of it.
  if (Status s = CheckOutput("--json", flags.json); !s.ok()) return fail(s);
  if (Status s = CheckOutput("--io-config", flags.io_config); !s.ok()) return fail(s);
  Result<IoBackendKind> kind = ParseIoBackendKind(flags.backend);
  if (!kind.ok()) return fail(kind.status());

  uint64_t bytes = *size, max_block = *block;
  uint32_t max_qd = flags.qd;
  if (flags.sweep) {
    max_block = 4 << 20;
    max_qd = 64;
    bytes = std::min<uint64_t>(bytes, 256ull << 20);  // seconds per round, not minutes
  }
  JobSet jobs;
  if (Status s = jobs.Setup(flags, *kind, bytes, max_block, max_qd); !s.ok()) return fail(s);
  PrintConfig(out, flags, jobs);
  nlohmann::json doc = {{"config",
                         {{"backend", jobs.first().backend_name()},
                          {"bytes_per_pass", jobs.first().bytes_per_pass()},
                          {"jobs", flags.numjobs},
                          {"iters", flags.iters},
                          {"warmup", flags.warmup},
                          {"runtime_s", flags.runtime},
                          {"rwmixread", flags.rwmixread},
                          {"seed", flags.seed}}}};
  for (const auto& f : jobs.first().files()) {
    doc["config"]["files"].push_back({{"file", f.path}, {"direct", f.direct}});
  }
  std::vector<CaseResult> rows;
  if (flags.sweep) {
    Result<SweepOutcome> s = Sweep(jobs, flags, modes, out);
    if (!s.ok()) return fail(s.status());
    rows = s->rows;
    doc["sweep"] = SweepJson(*s, flags, jobs.first().backend_name());
    PrintHeader(out);
    for (const CaseResult& r : rows) PrintRow(out, r);
    PrintSweep(out, *s);
    if (!flags.io_config.empty()) {
      const nlohmann::json cfg = {{"io", doc["sweep"]["io"]},
                                  {"measured",
                                   {{"rounds", s->rounds},
                                    {"stable", s->stable},
                                    {"median_MBps", s->settings[Best(s->settings)].Median()},
                                    {"paths", flags.paths}}}};
      if (Status st = WriteOutput("--io-config", flags.io_config, cfg.dump(2) + "\n"); !st.ok()) {
        return fail(st);
      }
      std::fprintf(out, "# wrote the best setting to %s\n", flags.io_config.c_str());
    }
  } else {
    PrintHeader(out);
    for (IoMode m : modes) {
      IoCase c;
      c.mode = m;
      c.block = *block;
      c.qd = flags.qd;
      c.iters = flags.iters;
      c.warmup = flags.warmup;
      c.runtime_s = flags.runtime;
      Result<CaseResult> r = jobs.Run(c);
      if (!r.ok()) return fail(r.status());
      rows.push_back(*r);
      PrintRow(out, *r);
    }
  }
  PrintPercentiles(out, rows);
  uint64_t wrong = 0;
  for (const CaseResult& r : rows) {
    doc["runs"].push_back(RowJson(r));
    wrong += r.wrong;
  }
  if (!flags.json.empty()) {
    if (Status s = WriteOutput("--json", flags.json, doc.dump(2) + "\n"); !s.ok()) return fail(s);
  }
  if (wrong > 0) {
    std::fprintf(stderr, "strata bench io: error: data check failed (#wrong > 0)\n");
    return 1;
  }
  return 0;
}

}  // namespace

void AddBenchIo(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<Flags>();
  CLI::App* io = bench.add_subcommand(
      "io",
      "Bandwidth, IOPS, latency and CPU cost of the NVMe swap path (io_uring or "
      "pread/pwrite)");
  io->add_option("-p,--path", flags->paths,
                 "folder on a drive to measure; repeat for several drives (files are striped "
                 "over them block by block)");
  io->add_option("-s,--size", flags->size,
                 "bytes per pass and job over all paths, with K/M/G/T suffix (binary)")
      ->capture_default_str();
  io->add_option("-b,--block", flags->block,
                 "bytes per request (multiple of 4K with O_DIRECT), with K/M/G suffix")
      ->capture_default_str();
  io->add_option("-q,--qd", flags->qd, "queue depth: requests in flight per job")
      ->capture_default_str();
  io->add_option("-m,--mode", flags->modes,
                 "read, write, randread, randwrite, rw or randrw (mixed by --rwmixread); "
                 "repeat for several (default: write read)");
  io->add_option("--rwmixread", flags->rwmixread, "percent of reads in rw and randrw")
      ->capture_default_str();
  io->add_option("--numjobs", flags->numjobs,
                 "jobs side by side, each with its own files, thread and queue")
      ->capture_default_str();
  io->add_option("--backend", flags->backend,
                 "I/O backend: auto (io_uring, else pread/pwrite), uring or posix")
      ->capture_default_str();
  AddSwitch(io, "direct", &flags->direct,
            "O_DIRECT; --no-direct uses the page cache, dropped before reads");
  io->add_flag("--sqpoll", flags->sqpoll, "io_uring kernel submission-queue polling thread")
      ->capture_default_str();
  AddSwitch(io, "fixed-buffers", &flags->fixed_buffers, "register the I/O buffers with io_uring");
  io->add_option("-i,--iters", flags->iters, "measured passes per case")->capture_default_str();
  io->add_option("-w,--warmup", flags->warmup, "unmeasured passes before them")
      ->capture_default_str();
  io->add_option("--runtime", flags->runtime,
                 "seconds: measure whole passes until this much time has passed, instead of "
                 "--iters (0: off)")
      ->capture_default_str();
  io->add_flag("--sweep", flags->sweep,
               "try block sizes 64K..4M x queue depths 1..64 on at most 256M, in rounds after a "
               "warm-up, until the best setting is stable; print the spread")
      ->capture_default_str();
  io->add_option("--sweep-rounds", flags->sweep_rounds, "most measured rounds of --sweep")
      ->capture_default_str();
  io->add_option("--io-config", flags->io_config,
                 "with --sweep: write the best setting (block, queue depth, backend, direct) "
                 "as JSON to FILE");
  io->add_option("--seed", flags->seed, "seed of the data pattern")->capture_default_str();
  io->add_option("--json", flags->json,
                 "write the configuration and every case as JSON to FILE (-: standard output; "
                 "the table then goes to standard error)");
  SetCallbackWithConfig(
      io, [flags] { return RunBenchIo(*flags); }, exit_code);
}

}  // namespace strata::cli
