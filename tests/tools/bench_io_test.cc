// Tests of `strata bench io`: runs the built strata binary (STRATA_CLI_PATH) on real files
// under /var/tmp and checks its output, its JSON and its errors (each by its message).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "tests/io/io_test_util.h"
#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::Contains;

// `strata <args>`: standard output in `output`, standard error apart in `err`.
CliRun Strata(const std::string& args) {
  testing::TempDir tmp;
  testing::CliRunOptions options;
  options.stderr_to = testing::CliStderr::kFile;
  options.stderr_path = tmp.File("stderr");
  options.timeout_s = 300;
  return testing::RunCli(args, options);
}

size_t FilesIn(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

TEST(BenchIo, TableHasConfigLinesARowPerCaseAndNoWrongBlocks) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() +
                    " --size 8M --block 1M --qd 4 --iters 1 --warmup 1 --mode write --mode read");
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  EXPECT_TRUE(Contains(r.output, "# strata bench io")) << r.output;
  EXPECT_TRUE(Contains(r.output, "# backend: ")) << r.output;
  EXPECT_TRUE(Contains(r.output, "MB/s")) << r.output;
  EXPECT_TRUE(Contains(r.output, "MiB/s")) << r.output;
  EXPECT_TRUE(Contains(r.output, "usr%")) << r.output;
  EXPECT_TRUE(Contains(r.output, "#wrong")) << r.output;
  EXPECT_TRUE(Contains(r.output, "#   read 1MiB qd 4: p1 ")) << r.output;
  EXPECT_TRUE(Contains(r.output, " p99.99 ")) << r.output;
  int rows = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.find('#') != std::string::npos) continue;
    char mode[32], block[32];
    unsigned long long qd, jobs, bytes, wrong;
    double secs, mbps, mibps, iops, mean, stdev, min, p50, p99, max, usr, sys;
    ASSERT_EQ(std::sscanf(line.c_str(),
                          "%31s %31s %llu %llu %llu %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf "
                          "%lf %llu",
                          mode, block, &qd, &jobs, &bytes, &secs, &mbps, &mibps, &iops, &mean,
                          &stdev, &min, &p50, &p99, &max, &usr, &sys, &wrong),
              18)
        << line;
    EXPECT_STREQ(block, "1MiB");
    EXPECT_EQ(qd, 4u);
    EXPECT_EQ(jobs, 1u);
    EXPECT_EQ(bytes, 8u << 20);
    EXPECT_GT(mbps, 0.0);
    EXPECT_NEAR(mibps, mbps * 1e6 / (1 << 20), 0.1 + mbps * 1e-3);
    EXPECT_LE(min, p50);
    EXPECT_LE(p50, p99);
    EXPECT_LE(p99, max);
    EXPECT_LE(min, mean);
    EXPECT_LE(mean, max);
    EXPECT_GE(usr + sys, 0.0);
    EXPECT_EQ(wrong, 0u);
    ++rows;
  }
  EXPECT_EQ(rows, 2);
  EXPECT_EQ(FilesIn(dir.path()), 0u) << "the benchmark must remove its files";
}

TEST(BenchIo, JsonStripesOverSeveralPathsWithRandomModes) {
  testing::TempDir a, b;
  CliRun r = Strata("bench io --path " + a.path() + " --path " + b.path() +
                    " --size 16M --block 256K --qd 8 --iters 2 --warmup 0 --mode randwrite "
                    "--mode randread --backend posix --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.output);  // only JSON on standard output
  EXPECT_TRUE(Contains(r.err, "# strata bench io")) << "the table goes to standard error";
  ASSERT_EQ(doc["runs"].size(), 2u);
  EXPECT_EQ(doc["runs"][0]["mode"], "randwrite");
  EXPECT_EQ(doc["runs"][1]["mode"], "randread");
  for (const auto& run : doc["runs"]) {
    for (const char* key :
         {"mode", "block_bytes", "queue_depth", "jobs", "bytes", "seconds", "MBps", "MiBps", "iops",
          "lat_us", "cpu_usr_pct", "cpu_sys_pct", "wrong"}) {
      EXPECT_TRUE(run.contains(key)) << key;
    }
    EXPECT_EQ(run["block_bytes"], 256 * 1024);
    EXPECT_EQ(run["queue_depth"], 8);
    EXPECT_EQ(run["bytes"], 2 * (16u << 20));
    EXPECT_EQ(run["requests"], 2 * 64);
    EXPECT_EQ(run["wrong"], 0);
    const auto& lat = run["lat_us"];
    double prev = lat["min"].get<double>();
    for (const char* p :
         {"p1", "p5", "p10", "p20", "p50", "p80", "p90", "p95", "p99", "p99.9", "p99.99"}) {
      ASSERT_TRUE(lat["percentiles"].contains(p)) << p;
      EXPECT_GE(lat["percentiles"][p].get<double>(), prev) << p;
      prev = lat["percentiles"][p].get<double>();
    }
    EXPECT_LE(prev, lat["max"].get<double>());
  }
  EXPECT_EQ(doc["runs"][0]["bytes_read"], 0);
  EXPECT_EQ(doc["runs"][1]["bytes_read"], 2 * (16u << 20));
  EXPECT_EQ(doc["config"]["backend"], "posix");
  EXPECT_EQ(doc["config"]["files"].size(), 2u);
  EXPECT_EQ(FilesIn(a.path()) + FilesIn(b.path()), 0u);
}

// randrw reads about --rwmixread percent of the blocks and checks all of them; --numjobs
// runs that many jobs, each over its own --size; --runtime measures whole passes for at
// least that long.
TEST(BenchIo, MixedReadWriteJobsAndRuntime) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() +
                    " --size 8M --block 64K --qd 8 --iters 2 --warmup 0 --mode randrw "
                    "--rwmixread 70 --numjobs 2 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  nlohmann::json run = nlohmann::json::parse(r.output)["runs"][0];
  EXPECT_EQ(run["jobs"], 2);
  EXPECT_EQ(run["bytes"], 2 * 2 * (8u << 20));  // 2 jobs x 2 passes
  const double reads = run["bytes_read"].get<double>() / run["bytes"].get<double>();
  EXPECT_GT(reads, 0.6);  // 512 requests at 70%: 0.6..0.8 with overwhelming probability
  EXPECT_LT(reads, 0.8);
  EXPECT_EQ(run["wrong"], 0);
  r = Strata("bench io --path " + dir.path() +
             " --size 4M --block 64K --qd 4 --warmup 0 --mode read --runtime 0.3 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  run = nlohmann::json::parse(r.output)["runs"][0];
  EXPECT_GE(run["seconds"].get<double>(), 0.3);
  EXPECT_EQ(run["bytes"].get<uint64_t>() % (4u << 20), 0u);
  EXPECT_EQ(FilesIn(dir.path()), 0u);
  r = Strata("bench io --path " + dir.path() + " --mode rw --rwmixread 101");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--rwmixread")) << r.err;
}

TEST(BenchIo, SweepRepeatsUntilStableAndWritesTheIoConfig) {
  testing::TempDir dir;
  const std::string cfg = dir.File("io.json");
  CliRun r = Strata("bench io --path " + dir.path() + " --size 8M --sweep --mode read " +
                    "--io-config " + cfg);
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  std::ifstream f(cfg);
  nlohmann::json best = nlohmann::json::parse(f);
  const std::set<uint64_t> blocks = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  const std::set<uint32_t> qds = {1, 4, 16, 64};
  EXPECT_TRUE(blocks.count(best["io"]["block_bytes"].get<uint64_t>())) << best;
  EXPECT_TRUE(qds.count(best["io"]["queue_depth"].get<uint32_t>())) << best;
  EXPECT_TRUE(best["io"]["backend"] == "uring" || best["io"]["backend"] == "posix") << best;
  const int rounds = best["measured"]["rounds"].get<int>();
  EXPECT_GE(rounds, best["measured"]["stable"].get<bool>() ? 3 : 8);
  EXPECT_TRUE(Contains(r.output, "# best: block ")) << r.output;
  EXPECT_TRUE(Contains(r.output, "median(MB/s)")) << r.output;
  size_t rows = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    rows += line.find('#') == std::string::npos && Contains(line, " read ");
  }
  EXPECT_EQ(rows, blocks.size() * qds.size());
  EXPECT_EQ(FilesIn(dir.path()), 1u) << "only the --io-config file stays";
  r = Strata("bench io --path " + dir.path() + " --io-config " + cfg);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--sweep")) << r.err;
}

TEST(BenchIo, BlockNotAMultipleOf4KWithDirect) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() + " --block 1000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--block 1000")) << r.err;
  EXPECT_TRUE(Contains(r.err, "multiple of 4096")) << r.err;
  EXPECT_TRUE(Contains(r.err, "--no-direct")) << r.err;
}

TEST(BenchIo, QueueDepthZero) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() + " --qd 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--qd 0")) << r.err;
  EXPECT_TRUE(Contains(r.err, "1 or more")) << r.err;
}

TEST(BenchIo, MissingPath) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.File("nope"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, dir.File("nope"))) << r.err;
  EXPECT_TRUE(Contains(r.err, "No such file")) << r.err;
  r = Strata("bench io --size 8M");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--path")) << r.err;
}

TEST(BenchIo, UnwritablePath) {
  // Root ignores permission bits; an immutable folder refuses new files even to root.
  testing::TempDir dir;
  const std::string ro = dir.File("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0755), 0);
  int fd = ::open(ro.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  int flags = 0;
  const bool immutable = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 &&
                         (flags |= FS_IMMUTABLE_FL, ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0);
  CliRun r;
  if (immutable) r = Strata("bench io --path " + ro + " --size 8M");
  flags &= ~FS_IMMUTABLE_FL;
  if (immutable) {
    EXPECT_EQ(::ioctl(fd, FS_IOC_SETFLAGS, &flags), 0);
  }
  ::close(fd);
  if (!immutable) GTEST_SKIP() << "cannot make a folder immutable here";
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, ro)) << r.err;
  EXPECT_TRUE(Contains(r.err, "not usable")) << r.err;
  EXPECT_TRUE(Contains(r.err, "permission denied")) << r.err;
}

TEST(BenchIo, SizeBeyondFreeSpaceIsRefusedBeforeWriting) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() + " --size 1000T");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "NoSpace")) << r.err;
  EXPECT_TRUE(Contains(r.err, dir.path())) << r.err;
  EXPECT_TRUE(Contains(r.err, "bytes free")) << r.err;
  EXPECT_TRUE(Contains(r.err, "needs 1099511627776000 bytes")) << r.err;
  EXPECT_EQ(FilesIn(dir.path()), 0u);
}

TEST(BenchIo, BadSizeModeAndBackendNames) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() + " --size 12Q");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--size 12Q is not a size")) << r.err;
  r = Strata("bench io --path " + dir.path() + " --mode seqread");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "--mode seqread")) << r.err;
  r = Strata("bench io --path " + dir.path() + " --backend libaio");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.err, "libaio")) << r.err;
}

TEST(BenchIo, TmpfsFallsBackToBufferedAndContinues) {
  const std::string shm = "/dev/shm/strata_bench_io_test_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(shm.c_str(), 0755), 0);
  CliRun r = Strata("bench io --path " + shm + " --size 8M --iters 1 --warmup 0");
  std::filesystem::remove_all(shm);
  EXPECT_EQ(r.exit_code, 0) << r.output << r.err;
  EXPECT_TRUE(Contains(r.err, "tmpfs")) << r.err;
  EXPECT_TRUE(Contains(r.err, "buffered")) << r.err;
  EXPECT_TRUE(Contains(r.output, "buffered")) << r.output;  // the # file line says so too
}

// The benchmark's files have names that anyone can predict (pid, job, index): a link planted at
// one, or any file already there, is refused, and what it points to is neither written nor
// removed. exec keeps the pid, so the child plants the link under its own and then execs.
TEST(BenchIo, AFilePlantedAtABenchmarkFileNameIsRefusedAndLeftAlone) {
  testing::TempDir dir, outside;
  const std::string target = outside.File("precious");
  { std::ofstream(target) << "the user's own"; }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string planted =
        dir.path() + "/strata_bench_io." + std::to_string(::getpid()) + ".0.0";
    if (::symlink(target.c_str(), planted.c_str()) != 0) _exit(100);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    const std::string path = dir.path();
    ::execl(STRATA_CLI_PATH, STRATA_CLI_PATH, "bench", "io", "--path", path.c_str(), "--size", "8M",
            "--iters", "1", "--warmup", "0", static_cast<char*>(nullptr));
    _exit(101);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 100) << "could not plant the link";
  EXPECT_NE(WEXITSTATUS(status), 0) << "the benchmark ran through the planted link";
  std::ifstream f(target);
  std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(got == "the user's own")
      << "the file the link points to now holds " << got.size() << " bytes";
  size_t entries = 0;  // nothing but the link is left there ...
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    entries += !e.is_directory();
  EXPECT_EQ(entries, 1u);
  const std::string planted = dir.path() + "/strata_bench_io." + std::to_string(pid) + ".0.0";
  struct stat st {};
  EXPECT_EQ(::lstat(planted.c_str(), &st), 0);  // ... and was not removed
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

// SIGINT during the run: the benchmark stops after the pass in flight, exits 130 and leaves no
// data file behind (it used to die by the signal with its file in place).
TEST(BenchIo, SigintRemovesTheDataFile) {
  testing::TempDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    const std::string path = dir.path();
    ::execl(STRATA_CLI_PATH, STRATA_CLI_PATH, "bench", "io", "--path", path.c_str(), "--size", "8M",
            "--iters", "1000000", "--warmup", "0", static_cast<char*>(nullptr));
    _exit(101);
  }
  // Wait until the data file exists and the passes run, then interrupt.
  for (int i = 0; i < 600 && FilesIn(dir.path()) == 0; ++i) ::usleep(50 * 1000);
  ASSERT_EQ(FilesIn(dir.path()), 1u) << "the benchmark made no data file in 30 s";
  ::usleep(300 * 1000);
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_EQ(FilesIn(dir.path()), 0u) << "the data file was left behind";
}

}  // namespace
}  // namespace strata
