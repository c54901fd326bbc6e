// SwapStore safety: the store never writes outside the folders it is given (symbolic links,
// hard links and non-regular files under its names are refused), every folder is locked
// against a second process and the lock names its holder, store files are private (0600),
// and a manifest cannot make the store preallocate more than the caller allows.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "io/manifest.h"
#include "io/swap_store.h"
#include "io_test_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

SwapStoreOptions Options(const std::vector<std::string>& paths, uint64_t capacity) {
  SwapStoreOptions o;
  o.paths = paths;
  o.capacity_bytes = capacity;
  o.backend.kind = IoBackendKind::kPosix;
  o.backend.queue_depth = 4;
  return o;
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A store with one committed extent in `dir`.
void MakeCommittedStore(const std::string& dir) {
  auto store = SwapStore::Open(Options({dir}, kMiB));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  AlignedBuffer buf(8192);
  std::memset(buf.data(), 7, 8192);
  ASSERT_TRUE((*store)->Write("k", buf.data(), 8192).ok());
  ASSERT_TRUE((*store)->Commit(1).ok());
}

TEST(SwapStoreSafetyTest, SymlinkPlantedAsSwapFileIsRefusedAndTargetUntouched) {
  TempDir dir, outside;
  const std::string target = outside.File("victim");
  WriteAll(target, "precious");
  ASSERT_EQ(::symlink(target.c_str(), dir.File("strata.swap.0-of-1").c_str()), 0);
  auto r = SwapStore::Open(Options({dir.path()}, 4 * kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("strata.swap.0-of-1"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(ReadAll(target), "precious");
}

TEST(SwapStoreSafetyTest, SwapFileReplacedByLinkBeforeResumeIsRefused) {
  TempDir dir, outside;
  MakeCommittedStore(dir.path());
  const std::string file = dir.File("strata.swap.0-of-1");
  const std::string target = outside.File("copy");
  std::filesystem::copy_file(file, target);
  const std::string before = ReadAll(target);
  ASSERT_EQ(::unlink(file.c_str()), 0);
  ASSERT_EQ(::symlink(target.c_str(), file.c_str()), 0);
  SwapStoreOptions o = Options({dir.path()}, 0);
  o.create = false;
  auto r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(ReadAll(target), before);
}

TEST(SwapStoreSafetyTest, HardLinkedSwapFileIsRefused) {
  TempDir dir;
  MakeCommittedStore(dir.path());
  const std::string file = dir.File("strata.swap.0-of-1");
  ASSERT_EQ(::link(file.c_str(), dir.File("elsewhere").c_str()), 0);
  auto r = SwapStore::Open(Options({dir.path()}, 0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hard links"), std::string::npos) << r.status().ToString();
}

TEST(SwapStoreSafetyTest, FifoPlantedAsSwapFileIsRefusedWithoutHanging) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.File("strata.swap.0-of-1").c_str(), 0600), 0);
  auto r = SwapStore::Open(Options({dir.path()}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos)
      << r.status().ToString();
}

TEST(SwapStoreSafetyTest, LinkedLockFileAndManifestAreRefused) {
  TempDir dir, outside;
  const std::string target = outside.File("victim");
  WriteAll(target, "precious");
  ASSERT_EQ(::symlink(target.c_str(), dir.File("strata.lock").c_str()), 0);
  auto r = SwapStore::Open(Options({dir.path()}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lock file"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(ReadAll(target), "precious");

  TempDir dir2;
  MakeCommittedStore(dir2.path());
  const std::string manifest = dir2.File("strata.manifest");
  std::filesystem::copy_file(manifest, outside.File("manifest"));
  ASSERT_EQ(::unlink(manifest.c_str()), 0);
  ASSERT_EQ(::symlink(outside.File("manifest").c_str(), manifest.c_str()), 0);
  r = SwapStore::Open(Options({dir2.path()}, 0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().ToString();
}

TEST(SwapStoreSafetyTest, EveryFolderIsLockedAndTheLockNamesTheHolder) {
  TempDir a, b, shared;
  auto first = SwapStore::Open(Options({a.path(), shared.path()}, kMiB));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = SwapStore::Open(Options({b.path(), shared.path()}, kMiB));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(shared.path()), std::string::npos)
      << second.status().ToString();
  EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())), std::string::npos)
      << second.status().ToString();
  EXPECT_EQ(FileSize(b.File("strata.swap.1-of-2")), 0u);  // nothing created for the loser
}

TEST(SwapStoreSafetyTest, SameFolderTwiceIsRefused) {
  TempDir a;
  auto r = SwapStore::Open(Options({a.path(), a.path() + "/."}, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("same folder"), std::string::npos) << r.status().ToString();
}

TEST(SwapStoreSafetyTest, StoreFilesAre0600WhateverTheUmask) {
  TempDir dir;
  const mode_t old = ::umask(0);
  {
    auto store = SwapStore::Open(Options({dir.path()}, kMiB));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->Commit(1).ok());
  }
  ::umask(old);
  for (const char* name : {"strata.swap.0-of-1", "strata.manifest", "strata.lock"}) {
    struct stat st {};
    ASSERT_EQ(::stat(dir.File(name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
}

TEST(SwapStoreSafetyTest, ManifestCannotInflateThePreallocation) {
  TempDir dir;
  MakeCommittedStore(dir.path());
  // Rewrite the manifest (checksum and all) to claim 1 GiB of capacity.
  const std::string path = dir.File("strata.manifest");
  auto m = swap_internal::DecodeManifest(ReadAll(path), path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  m->capacity_bytes = 1ull << 30;
  WriteAll(path, swap_internal::EncodeManifest(*m));
  SwapStoreOptions o = Options({dir.path()}, 0);
  o.create = false;
  o.max_capacity_bytes = 2 * kMiB;
  auto store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_LE(FileSize(dir.File("strata.swap.0-of-1")), 2 * kMiB);
  EXPECT_LE((*store)->Stats().capacity_bytes, 2 * kMiB);
  AlignedBuffer buf(8192);
  auto got = (*store)->Read("k", buf.data(), 8192);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(static_cast<unsigned char>(buf.data()[8191]), 7);
}

// A store knows the run that made it: a manifest and data file copied from another run
// (or rank) are refused by name, a caller that names no run adopts the store's, and the
// identity survives every commit and a version 1 manifest (no identity) still opens.
TEST(SwapStoreSafetyTest, StoreOfAnotherRunIsRefused) {
  TempDir mine, theirs;
  auto opts = [](const std::string& dir, const std::string& id) {
    SwapStoreOptions o = Options({dir}, kMiB);
    o.run_id = id;
    return o;
  };
  AlignedBuffer buf(8192);
  for (const auto& [dir, id, fill] :
       {std::tuple{mine.path(), "run-a rank 0", 1}, std::tuple{theirs.path(), "run-b rank 0", 2}}) {
    auto store = SwapStore::Open(opts(dir, id));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    std::memset(buf.data(), fill, 8192);
    ASSERT_TRUE((*store)->Write("k", buf.data(), 8192).ok());
    ASSERT_TRUE((*store)->Commit(1).ok());
    ASSERT_TRUE((*store)->Commit(2).ok());  // a later commit keeps the identity
  }
  auto reopen = [&](const std::string& id) {
    SwapStoreOptions o = opts(mine.path(), id);
    o.capacity_bytes = 0;
    o.create = false;
    return SwapStore::Open(o);
  };
  ASSERT_TRUE(reopen("run-a rank 0").ok());
  // Copy the other run's manifest and data file over this one's (same step, same keys).
  for (const char* name : {"strata.manifest", "strata.swap.0-of-1"}) {
    WriteAll(mine.File(name), ReadAll(theirs.File(name)));
  }
  auto r = reopen("run-a rank 0");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().path(), mine.File("strata.manifest"));
  EXPECT_NE(r.status().message().find("belongs to another run"), std::string::npos);
  EXPECT_NE(r.status().message().find("'run-b rank 0'"), std::string::npos);
  EXPECT_NE(r.status().message().find("'run-a rank 0'"), std::string::npos);
  // Without an identity asked for, the store opens and its commits keep its own.
  {
    auto any = reopen("");
    ASSERT_TRUE(any.ok()) << any.status().ToString();
    ASSERT_TRUE((*any)->Commit(3).ok());
  }
  ASSERT_TRUE(reopen("run-b rank 0").ok());
  // A version 1 manifest (no identity) opens without one and is refused with one.
  auto m = swap_internal::DecodeManifest(ReadAll(mine.File("strata.manifest")), "m");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->run_id, "run-b rank 0");
  m->run_id.clear();
  const std::string v1 = swap_internal::EncodeManifest(*m);
  EXPECT_EQ(v1[8], 1);  // the version field
  WriteAll(mine.File("strata.manifest"), v1);
  EXPECT_TRUE(reopen("").ok());
  r = reopen("run-a rank 0");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no run identity"), std::string::npos)
      << r.status().ToString();
  // Too long an identity is refused before anything is opened.
  EXPECT_EQ(reopen(std::string(257, 'x')).status().code(), StatusCode::kInvalidArgument);
}

// Reopening (create = false) a folder that holds no store leaves it as it was: no lock
// file, no data file.
TEST(SwapStoreSafetyTest, ReopeningAFolderWithoutAStoreMakesNothingThere) {
  TempDir dir;
  SwapStoreOptions o = Options({dir.path()}, kMiB);
  o.create = false;
  auto r = SwapStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no swap store in " + dir.path()), std::string::npos)
      << r.status().ToString();
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace strata
