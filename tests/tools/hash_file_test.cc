// HashFile (tools/strata/run_record.h), the hash a run's record keeps of --data and
// --tokenizer: its read loop must retry a read that a signal interrupted (EINTR), as
// InputFile::ReadAll does, rather than fail the run. The interruption is injected: this test
// binary interposes read(2) and fails the first read of the armed descriptor with EINTR.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <string>

#include "tests/io/io_test_util.h"
#include "tools/strata/run_record.h"

namespace {
std::atomic<int> g_eintr_reads{0};  // reads still to fail with EINTR
}  // namespace

// Fault injection: the next g_eintr_reads reads of any descriptor fail with EINTR.
extern "C" ssize_t read(int fd, void* buf, size_t count) {
  using ReadFn = ssize_t (*)(int, void*, size_t);
  static const ReadFn real = reinterpret_cast<ReadFn>(::dlsym(RTLD_NEXT, "read"));
  int left = g_eintr_reads.load();
  while (left > 0 && !g_eintr_reads.compare_exchange_weak(left, left - 1)) {
  }
  if (left > 0) {
    errno = EINTR;
    return -1;
  }
  return real(fd, buf, count);
}

namespace strata::cli {
namespace {

TEST(HashFile, RetriesAReadInterruptedBySignal) {
  testing::TempDir dir;
  const std::string path = dir.File("data.txt");
  const std::string text(3 << 20, 'x');  // three reads of HashFile's 1 MiB buffer
  { std::ofstream(path) << text; }
  g_eintr_reads = 2;
  Result<FileHash> h = HashFile("--data", path);
  const int left = g_eintr_reads.exchange(0);
  ASSERT_EQ(left, 0) << "the injected EINTR was never hit: HashFile no longer uses read(2)";
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->bytes, text.size());
  Result<FileHash> again = HashFile("--data", path);  // no interruption this time
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(h->xxh3, again->xxh3);
}

}  // namespace
}  // namespace strata::cli
