// Bad input to the I/O backends, each checked by the message the user would read: missing
// path, read-only path, tmpfs path (buffered fallback with one warning), queue depth 0,
// unknown backend names, and the automatic posix fallback when io_uring cannot be set up
// (simulated for real with a seccomp filter in a child process).
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/fs.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/io.h"
#include "strata/log.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::TempDir;

// Captures log messages for the life of the object.
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](LogLevel level, std::string_view m) {
      std::lock_guard<std::mutex> lock(mu_);
      if (level == LogLevel::kWarning) warnings_.emplace_back(m);
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }
  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mu_);
    return warnings_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> warnings_;
};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class IoBackendErrors : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    IoBackendOptions o;
    o.kind = GetParam();
    Result<std::unique_ptr<IoBackend>> b = CreateIoBackend(o);
    if (!b.ok() && b.status().IsNotSupported()) GTEST_SKIP() << b.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
  }
  TempDir dir_;
  std::unique_ptr<IoBackend> backend_;
};

TEST_P(IoBackendErrors, MissingFolderIsNotFoundNamingTheFolder) {
  const std::string path = dir_.File("no_such_folder/swap.0");
  Result<int> f = backend_->OpenFile(path, {.create = true});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound) << f.status().ToString();
  EXPECT_TRUE(Contains(f.status().message(), dir_.File("no_such_folder"))) << f.status().message();
  EXPECT_TRUE(Contains(f.status().message(), "does not exist")) << f.status().message();
  EXPECT_EQ(f.status().path(), path);
  EXPECT_EQ(f.status().err_no(), ENOENT);
}

TEST_P(IoBackendErrors, MissingFileWithoutCreateIsNotFound) {
  Result<int> f = backend_->OpenFile(dir_.File("absent"), {.create = false});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(f.status().message(), "file does not exist")) << f.status().message();
}

TEST_P(IoBackendErrors, FolderIsNotAFile) {
  Result<int> f = backend_->OpenFile(dir_.path(), {.direct = false});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(Contains(f.status().message(), "folder")) << f.status().message();
}

TEST_P(IoBackendErrors, WriteToAFileOpenedReadOnlyIsRefused) {
  {
    Result<int> w = backend_->OpenFile(dir_.File("ro"), {.create = true});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(backend_->Allocate(*w, 4096).ok());
    ASSERT_TRUE(backend_->CloseFile(*w).ok());
  }
  Result<int> f = backend_->OpenFile(dir_.File("ro"), {.read_only = true});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  AlignedBuffer buf(4096);
  IoRequest w{IoOp::kWrite, *f, 0, buf.data(), 4096, 0};
  Status s = backend_->Submit({&w, 1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "read-only")) << s.message();
  EXPECT_TRUE(Contains(s.message(), dir_.File("ro"))) << s.message();
  IoRequest r{IoOp::kRead, *f, 0, buf.data(), 4096, 0};
  EXPECT_TRUE(backend_->RunSync({&r, 1}).ok()) << "reads still work";
}

// Tests run as root, so permission bits do not stop them: use places the kernel itself
// refuses to write, whatever the caller's privileges.
TEST_P(IoBackendErrors, UnwritablePathsSayWhy) {
  // sysfs does not let anyone create files.
  Result<int> f = backend_->OpenFile("/sys/strata_io_test_file", {.create = true});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(Contains(f.status().message(), "/sys/strata_io_test_file")) << f.status().message();
  EXPECT_TRUE(Contains(f.status().message(), "permission denied") ||
              Contains(f.status().message(), "read-only"))
      << f.status().message();

  // An immutable file (chattr +i) cannot be opened for writing even by root.
  const std::string path = dir_.File("immutable");
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  int flags = 0;
  bool immutable = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 &&
                   (flags |= FS_IMMUTABLE_FL, ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0);
  ::close(fd);
  if (!immutable) GTEST_SKIP() << "cannot set the immutable flag here: " << std::strerror(errno);
  Result<int> g = backend_->OpenFile(path, {});
  // Clear the flag before asserting so the folder can always be removed.
  fd = ::open(path.c_str(), O_RDONLY);
  flags &= ~FS_IMMUTABLE_FL;
  EXPECT_EQ(::ioctl(fd, FS_IOC_SETFLAGS, &flags), 0);
  ::close(fd);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(Contains(g.status().message(), "permission denied")) << g.status().message();
  EXPECT_TRUE(Contains(g.status().message(), "for writing")) << g.status().message();
  EXPECT_EQ(g.status().path(), path);
}

TEST_P(IoBackendErrors, TmpfsFallsBackToBufferedWithOneWarning) {
  // The warning comes once per folder per process: a folder of its own for each run.
  const std::string folder =
      "/dev/shm/strata_io_test_" + std::to_string(::getpid()) + "_" + IoBackendKindName(GetParam());
  ASSERT_EQ(::mkdir(folder.c_str(), 0755), 0) << std::strerror(errno);
  const std::string a = folder + "/a", b = folder + "/b";
  LogCapture log;
  Result<int> fa = backend_->OpenFile(a, {.create = true, .direct = true});
  Result<int> fb = backend_->OpenFile(b, {.create = true, .direct = true});
  ::unlink(a.c_str());
  ::unlink(b.c_str());
  ::rmdir(folder.c_str());
  ASSERT_TRUE(fa.ok()) << fa.status().ToString();
  ASSERT_TRUE(fb.ok()) << fb.status().ToString();
  EXPECT_FALSE(backend_->IsDirect(*fa));
  EXPECT_FALSE(backend_->IsDirect(*fb));
  std::vector<std::string> w = log.warnings();
  ASSERT_EQ(w.size(), 1u) << "one warning per folder, not one per file";
  EXPECT_TRUE(Contains(w[0], a)) << w[0];
  EXPECT_TRUE(Contains(w[0], "tmpfs")) << w[0];
  EXPECT_TRUE(Contains(w[0], "buffered")) << w[0];
  // The run continues: unaligned buffered I/O works on the fallback file.
  char out[17] = "sixteen bytes+!!", in[17] = {};
  IoRequest wr{IoOp::kWrite, *fa, 3, out, 17, 0};
  ASSERT_TRUE(backend_->RunSync({&wr, 1}).ok());
  IoRequest rd{IoOp::kRead, *fa, 3, in, 17, 0};
  ASSERT_TRUE(backend_->RunSync({&rd, 1}).ok());
  EXPECT_EQ(std::memcmp(in, out, 17), 0);
}

TEST_P(IoBackendErrors, QueueDepthZeroIsRefused) {
  IoBackendOptions o;
  o.kind = GetParam();
  o.queue_depth = 0;
  Result<std::unique_ptr<IoBackend>> b = CreateIoBackend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(b.status().message(), "queue depth 0")) << b.status().message();
}

INSTANTIATE_TEST_SUITE_P(Backends, IoBackendErrors,
                         ::testing::Values(IoBackendKind::kPosix, IoBackendKind::kUring),
                         [](const ::testing::TestParamInfo<IoBackendKind>& i) {
                           return std::string(IoBackendKindName(i.param));
                         });

TEST(IoBackendKindNames, ParseAndPrint) {
  for (IoBackendKind k : {IoBackendKind::kAuto, IoBackendKind::kUring, IoBackendKind::kPosix}) {
    Result<IoBackendKind> p = ParseIoBackendKind(IoBackendKindName(k));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, k);
  }
  Result<IoBackendKind> bad = ParseIoBackendKind("libaio");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "'libaio'")) << bad.status().message();
  EXPECT_TRUE(Contains(bad.status().message(), "auto, uring or posix"));
}

// setenv for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(IoBackendEnv, StrataIoBackendChoosesWhenKindIsAuto) {
  {
    ScopedEnv env("STRATA_IO_BACKEND", "posix");
    Result<std::unique_ptr<IoBackend>> b = CreateIoBackend({});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ((*b)->Name(), "posix");
    // An explicit kind wins over the environment.
    IoBackendOptions o;
    o.kind = IoBackendKind::kUring;
    Result<std::unique_ptr<IoBackend>> u = CreateIoBackend(o);
    if (u.ok()) {
      EXPECT_EQ((*u)->Name(), "io_uring");
    }
  }
  {
    ScopedEnv env("STRATA_IO_BACKEND", "spdk");
    Result<std::unique_ptr<IoBackend>> b = CreateIoBackend({});
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(b.status().message(), "STRATA_IO_BACKEND=spdk")) << b.status().message();
  }
}

// --- io_uring unavailable: run this binary again in a child whose seccomp filter makes
// io_uring_setup fail, the way a kernel without io_uring (ENOSYS) or a container policy
// (EPERM) does. The child test below checks the fallback and reports through its exit code.

constexpr char kChildEnv[] = "IO_BACKEND_TEST_SECCOMP_CHILD";

int InstallIoUringFilter(int err) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & 0xffff)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])),
                            filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return static_cast<int>(::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog));
}

// Returns the child's exit status and output.
int RunChildWithoutIoUring(int err, std::string* output) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    ::close(pipefd[0]);
    if (InstallIoUringFilter(err) != 0) ::_exit(77);
    ::setenv(kChildEnv, err == ENOSYS ? "ENOSYS" : "EPERM", 1);
    ::unsetenv("STRATA_IO_BACKEND");
    const char* argv[] = {"/proc/self/exe", "--gtest_filter=IoUringUnavailableChild.*", nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    ::_exit(78);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) output->append(buf, size_t(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(IoUringUnavailable, AutoFallsBackToPosixWithOneWarning) {
  for (int err : {ENOSYS, EPERM}) {
    std::string out;
    const int rc = RunChildWithoutIoUring(err, &out);
    if (rc == 77) GTEST_SKIP() << "seccomp filters are not available here";
    EXPECT_EQ(rc, 0) << "child (io_uring_setup -> " << std::strerror(err) << ") failed:\n" << out;
    EXPECT_TRUE(Contains(out, "[  PASSED  ] 1 test")) << out;
  }
}

// Runs only in the child started above, where io_uring_setup fails.
TEST(IoUringUnavailableChild, Fallback) {
  const char* mode = std::getenv(kChildEnv);
  if (mode == nullptr) GTEST_SKIP() << "runs only inside IoUringUnavailable's child process";
  const bool enosys = std::string(mode) == "ENOSYS";
  LogCapture log;
  Result<std::unique_ptr<IoBackend>> a = CreateIoBackend({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->Name(), "posix");
  Result<std::unique_ptr<IoBackend>> b = CreateIoBackend({});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->Name(), "posix");
  std::vector<std::string> w = log.warnings();
  ASSERT_EQ(w.size(), 1u) << "exactly one warning for the whole process";
  EXPECT_TRUE(Contains(w[0], enosys ? "ENOSYS" : "EPERM")) << w[0];
  EXPECT_TRUE(Contains(w[0], "pread/pwrite")) << w[0];
  if (!enosys) {
    EXPECT_TRUE(Contains(w[0], "io_uring_disabled")) << w[0];
  }

  IoBackendOptions o;
  o.kind = IoBackendKind::kUring;
  Result<std::unique_ptr<IoBackend>> u = CreateIoBackend(o);
  ASSERT_FALSE(u.ok());
  EXPECT_TRUE(u.status().IsNotSupported()) << u.status().ToString();
  EXPECT_TRUE(Contains(u.status().message(), "io_uring")) << u.status().message();

  // The fallback does real I/O.
  TempDir dir;
  Result<int> f = (*a)->OpenFile(dir.File("x"), {.create = true});
  ASSERT_TRUE(f.ok());
  AlignedBuffer buf(8192);
  testing::FillPattern(buf.data(), 4096, 3);
  IoRequest wr{IoOp::kWrite, *f, 0, buf.data(), 4096, 0};
  ASSERT_TRUE((*a)->RunSync({&wr, 1}).ok());
  IoRequest rd{IoOp::kRead, *f, 0, buf.data() + 4096, 4096, 0};
  ASSERT_TRUE((*a)->RunSync({&rd, 1}).ok());
  EXPECT_EQ(std::memcmp(buf.data(), buf.data() + 4096, 4096), 0);
}

}  // namespace
}  // namespace strata
