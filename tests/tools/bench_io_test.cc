// Tests of `strata bench io`: runs the built strata binary (STRATA_CLI_PATH) on real files
// under /var/tmp and checks its output, its JSON and its errors (each by its message).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
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
  EXPECT_TRUE(Contains(r.output, "bw(GB/s)")) << r.output;
  EXPECT_TRUE(Contains(r.output, "#wrong")) << r.output;
  int rows = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.find('#') != std::string::npos) continue;
    char mode[32];
    unsigned long long block, qd, bytes, wrong;
    double secs, gbps, iops, p50, p99;
    ASSERT_EQ(std::sscanf(line.c_str(), "%31s %llu %llu %llu %lf %lf %lf %lf %lf %llu", mode,
                          &block, &qd, &bytes, &secs, &gbps, &iops, &p50, &p99, &wrong),
              10)
        << line;
    EXPECT_EQ(block, 1u << 20);
    EXPECT_EQ(qd, 4u);
    EXPECT_EQ(bytes, 8u << 20);
    EXPECT_GT(gbps, 0.0);
    EXPECT_LE(p50, p99);
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
                    "--mode randread --backend posix --json");
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.output);
  ASSERT_EQ(doc["runs"].size(), 2u);
  EXPECT_EQ(doc["runs"][0]["mode"], "randwrite");
  EXPECT_EQ(doc["runs"][1]["mode"], "randread");
  for (const auto& run : doc["runs"]) {
    for (const char* key : {"mode", "block_bytes", "queue_depth", "bytes", "seconds", "gbps",
                            "iops", "lat_p50_us", "lat_p99_us", "wrong"}) {
      EXPECT_TRUE(run.contains(key)) << key;
    }
    EXPECT_EQ(run["block_bytes"], 256 * 1024);
    EXPECT_EQ(run["queue_depth"], 8);
    EXPECT_EQ(run["bytes"], 2 * (16u << 20));
    EXPECT_EQ(run["wrong"], 0);
  }
  EXPECT_EQ(doc["config"]["backend"], "posix");
  EXPECT_EQ(doc["config"]["files"].size(), 2u);
  EXPECT_EQ(FilesIn(a.path()) + FilesIn(b.path()), 0u);
}

TEST(BenchIo, SweepPrintsTheBestSettingAsEngineJson) {
  testing::TempDir dir;
  CliRun r = Strata("bench io --path " + dir.path() + " --size 8M --sweep --mode read");
  ASSERT_EQ(r.exit_code, 0) << r.output << r.err;
  std::string body = r.output;
  while (!body.empty() && body.back() == '\n') body.pop_back();
  const std::string last = body.substr(body.rfind('\n') + 1);  // the JSON is the last line
  nlohmann::json best = nlohmann::json::parse(last);
  const std::set<uint64_t> blocks = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  const std::set<uint32_t> qds = {1, 4, 16, 64};
  EXPECT_TRUE(blocks.count(best["io"]["block_bytes"].get<uint64_t>())) << last;
  EXPECT_TRUE(qds.count(best["io"]["queue_depth"].get<uint32_t>())) << last;
  EXPECT_TRUE(best["io"]["backend"] == "uring" || best["io"]["backend"] == "posix") << last;
  size_t rows = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    rows += line.find('#') == std::string::npos && Contains(line, " read ");
  }
  EXPECT_EQ(rows, blocks.size() * qds.size());
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

}  // namespace
}  // namespace strata
