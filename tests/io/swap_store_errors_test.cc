// SwapStore refusals and failures, each a status that names what is wrong and what to do:
// tmpfs without O_DIRECT (a warning and buffered I/O), missing, non-folder and read-only
// paths, a capacity beyond the free space, bad arguments, a damaged manifest or short file
// (corruption), a full disk during writes and at preallocation (NoSpace, the committed
// state kept).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "io/fault_injection_backend.h"
#include "io/swap_store.h"
#include "strata/log.h"
#include "tests/io/io_test_util.h"
#include "tests/io/swap_store_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::TempDir;
using namespace swap_store_test;  // NOLINT: the store tests' shared vocabulary

TEST(SwapStoreTest, TmpfsFallsBackToBufferedIoWithAWarning) {
  std::string tmpl = "/dev/shm/strata_swap_test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  std::vector<std::string> warnings;
  SetLogSink([&](LogLevel level, std::string_view m) {
    if (level == LogLevel::kWarning) warnings.emplace_back(m);
  });
  for (IoBackendKind kind : {IoBackendKind::kPosix, IoBackendKind::kUring}) {
    auto o = Options({tmpl}, 4 * kMiB, kind);
    {
      auto store = MustOpen(o);
      ASSERT_TRUE(store);
      EXPECT_FALSE(store->Stats().paths[0].direct);
      ASSERT_TRUE(WriteString(*store, "a", Pattern(kMiB + 7, 9)).ok());
      ASSERT_TRUE(store->Commit(1).ok());
    }
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    auto got = ReadAll(*store, "a");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, Pattern(kMiB + 7, 9));
    store.reset();
    std::filesystem::remove_all(tmpl);
    ASSERT_EQ(::mkdir(tmpl.c_str(), 0700), 0);
  }
  SetLogSink(nullptr);
  std::filesystem::remove_all(tmpl);
  bool named = false;
  for (const auto& w : warnings) named |= w.find(tmpl) != std::string::npos;
  EXPECT_TRUE(named) << "no warning named " << tmpl;
}

TEST(SwapStoreTest, MissingPathAndNonFolderAreNamed) {
  TempDir dir;
  std::string missing = dir.path() + "/does/not/exist";
  auto r = SwapStore::Open(Options({dir.path(), missing}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("mkdir -p"), std::string::npos);

  std::string file = dir.File("plain");
  int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ::close(fd);
  r = SwapStore::Open(Options({file}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(file + " is not a folder"), std::string::npos)
      << r.status().ToString();
}

TEST(SwapStoreTest, ReadOnlyFolderIsRefusedByName) {
  TempDir dir;
  const std::string path = dir.path();
  // A child process, so that root can drop its privileges (root writes anywhere).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    if (::geteuid() != 0) ::chmod(path.c_str(), 0555);
    auto r = SwapStore::Open(Options({path}, kMiB));
    std::string msg = r.status().ToString();
    (void)!::write(fds[1], msg.data(), msg.size());
    ::_exit(r.ok() ? 1 : 0);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) msg.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << msg;
  EXPECT_NE(msg.find("InvalidArgument: swap folder " + path + " is not writable"),
            std::string::npos)
      << msg;
}

TEST(SwapStoreTest, CapacityBeyondFreeSpaceIsRefusedBeforeWriting) {
  TempDir a, b;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(a.path().c_str(), &vfs), 0);
  const uint64_t free_now = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  auto r = SwapStore::Open(Options({a.path()}, free_now + (1ull << 40)));
  ASSERT_FALSE(r.ok());
  const Status& s = r.status();
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
  EXPECT_EQ(s.path(), a.path());
  // "swap folder /x cannot hold the swap files: 1.00 GiB (N bytes) free, 2.00 GiB (M bytes)
  // needed ..."
  std::smatch m;
  std::string msg = s.message();
  ASSERT_TRUE(std::regex_search(
      msg, m,
      std::regex("swap folder " + a.path() +
                 " cannot hold the swap files: .*\\((\\d+) bytes\\) free, .*\\((\\d+) bytes\\) "
                 "needed")))
      << msg;
  const uint64_t free_said = std::stoull(m[1]), needed_said = std::stoull(m[2]);
  EXPECT_GE(needed_said, free_now + (1ull << 40));
  EXPECT_LT(free_said, free_now + free_now / 10 + (1ull << 30));
  EXPECT_GT(free_said + free_now / 10 + (1ull << 30), free_now);

  // Two folders on one file system: each alone would fit, together they do not.
  r = SwapStore::Open(Options({a.path(), b.path()}, free_now / 2 * 3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(r.status().message().find("swap folders " + a.path() + ", " + b.path()),
            std::string::npos)
      << r.status().message();
  // Nothing was written.
  for (const auto* d : {&a, &b}) {
    for (const auto& e : std::filesystem::directory_iterator(d->path())) {
      EXPECT_EQ(e.path().filename().string().find("strata.swap"), std::string::npos) << e.path();
      EXPECT_NE(e.path().filename().string(), "strata.manifest");
    }
  }
}

TEST(SwapStoreTest, BadArgumentsAreNamed) {
  TempDir dir;
  auto r = SwapStore::Open(Options({dir.path()}, kMiB, IoBackendKind::kPosix, 5000));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stripe size 5000 is not a multiple of 4096"),
            std::string::npos)
      << r.status().ToString();
  r = SwapStore::Open(Options({dir.path()}, 0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("capacity is 0"), std::string::npos);
  r = SwapStore::Open(Options({}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  auto o = Options({dir.path()}, kMiB);
  o.create = false;
  r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);

  auto store = MustOpen(Options({dir.path()}, kMiB));
  ASSERT_TRUE(store);
  AlignedBuffer buf(8192);
  auto t = store->SubmitWrite("k", buf.data() + 8, 100);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("not 4096-byte aligned"), std::string::npos);
  EXPECT_EQ(store->SubmitWrite("", buf.data(), 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->SubmitRead("k", nullptr, 100).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Write("k", buf.data(), 5000).ok());
  auto small = store->Read("k", buf.data(), 4999);  // buffer smaller than the extent
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Wait(12345).code(), StatusCode::kInvalidArgument);

  // A second Open of the same store is refused while the first holds it: here, one of this
  // process (another process's is named as such: StoreHeldByAnotherProcessNamesItsPid).
  auto second = SwapStore::Open(Options({dir.path()}, kMiB));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another engine in this process (pid " +
                                           std::to_string(::getpid()) + ")"),
            std::string::npos)
      << second.status().ToString();
  ASSERT_TRUE(store->Commit(1).ok());
  store.reset();

  // Re-opening with another geometry: the folders' stripe markers refuse it first (a store
  // over {dir, other} would take dir, folder 0 of 1 of a committed store).
  TempDir other;
  r = SwapStore::Open(Options({dir.path(), other.path()}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("holds folder 0 of 1 of the swap store"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("committed at step 1"), std::string::npos)
      << r.status().ToString();
  r = SwapStore::Open(Options({dir.path()}, 0, IoBackendKind::kPosix, 8192));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stripe"), std::string::npos);
  r = SwapStore::Open(Options({dir.path()}, 4096));  // below the committed extent's end
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'k'"), std::string::npos) << r.status().ToString();
  // 0 keeps the stored capacity and stripe.
  auto again = MustOpen(Options({dir.path()}, 0));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->Stats().capacity_bytes, kMiB);
  EXPECT_EQ(again->Stats().stripe_bytes, kMiB);
}

// A store held by another process is refused naming that process's pid (what to stop).
TEST(SwapStoreTest, StoreHeldByAnotherProcessNamesItsPid) {
  TempDir dir;
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto held = SwapStore::Open(Options({dir.path()}, kMiB));
    const char ok = held.ok() ? 1 : 0;
    (void)!::write(ready[1], &ok, 1);
    char c;
    (void)!::read(release[0], &c, 1);  // holds the store until the parent has looked
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  auto second = SwapStore::Open(Options({dir.path()}, kMiB));
  (void)!::write(release[1], "x", 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another process (pid " +
                                           std::to_string(child) + ")"),
            std::string::npos)
      << second.status().ToString();
  EXPECT_NE(second.status().message().find("stop it or use another folder"), std::string::npos);
}

TEST(SwapStoreTest, DamagedManifestAndShortFileAreCorruption) {
  TempDir dir;
  auto o = Options({dir.path()}, 4 * kMiB);
  std::string data_file;
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    ASSERT_TRUE(WriteString(*store, "a", Pattern(2 * kMiB, 1)).ok());
    ASSERT_TRUE(store->Commit(1).ok());
    data_file = store->Stats().paths[0].data_file;
  }
  const std::string manifest = dir.File("strata.manifest");
  std::string saved;
  {
    std::ifstream in(manifest, std::ios::binary);
    saved.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(saved.size(), 40u);
  std::string damaged = saved;
  damaged[40] ^= 1;
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << damaged;
  auto r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(r.status().path(), manifest);
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos);
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << saved.substr(0, 30);
  r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);

  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << saved;
  ASSERT_EQ(::truncate(data_file.c_str(), kMiB), 0);
  r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find(data_file + " came back short"), std::string::npos)
      << r.status().ToString();
  ASSERT_EQ(::unlink(data_file.c_str()), 0);
  r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(data_file + " named by the manifest is missing"),
            std::string::npos)
      << r.status().ToString();
}

// ENOSPC from the disk: the write fails with NoSpace, the previous versions stay, and the
// committed state is intact after a re-open.
TEST(SwapStoreTest, DiskFullIsNoSpaceAndKeepsCommittedState) {
  TempDir dir;
  auto o = Options({dir.path()}, 16 * kMiB);
  std::map<std::string, std::string> committed;
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    for (int k = 0; k < 6; ++k) {
      committed["e" + std::to_string(k)] = Pattern(100000 + k, k);
      ASSERT_TRUE(
          WriteString(*store, "e" + std::to_string(k), committed["e" + std::to_string(k)]).ok());
    }
    ASSERT_TRUE(store->Commit(1).ok());
  }
  FaultInjectionOptions f;
  f.seed = 7;
  f.enospc = 0.5;
  FaultInjectionBackend* fault = nullptr;
  std::map<std::string, std::string> current = committed;
  {
    auto store = OpenFaulty(o, f, &fault);
    ASSERT_TRUE(store);
    int nospace = 0;
    for (int i = 0; i < 30; ++i) {
      std::string key = "e" + std::to_string(i % 6);
      std::string data = Pattern(200000 + i, 1000 + i);
      Status s = WriteString(*store, key, data);
      if (s.ok()) {
        current[key] = data;
      } else {
        ASSERT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
        ++nospace;
      }
      auto got = ReadAll(*store, key);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, current[key]);
    }
    EXPECT_GT(nospace, 0);
    EXPECT_GT(fault->counters().enospc, 0u);
    // Not committed: the crash-free re-open below must show step 1's state.
  }
  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->CommittedStep(), std::optional<uint64_t>(1));
  for (const auto& [k, v] : committed) {
    auto got = ReadAll(*store, k);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, v) << k;
  }
}

TEST(SwapStoreTest, EnospcAtPreallocationIsNoSpace) {
  TempDir dir;
  auto o = Options({dir.path()}, 4 * kMiB);
  auto inner = CreateIoBackend(o.backend);
  ASSERT_TRUE(inner.ok());
  FaultInjectionOptions f;
  f.enospc = 1.0;
  auto r = SwapStore::Open(o, std::make_unique<FaultInjectionBackend>(std::move(inner).value(), f));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(r.status().message().find("preallocating swap file"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace strata
