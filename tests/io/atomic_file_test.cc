// AtomicFile: the destination holds the old or the complete new contents, never a temporary
// left behind; links, folders and missing folders are refused naming the path; the mode is
// exact whatever the umask.
#include "strata/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io_test_util.h"

namespace strata {
namespace {

using testing::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

int Entries(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

TEST(AtomicFileTest, ReplacesContentsAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.File("out.json");
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second, longer").ok());
  EXPECT_EQ(ReadAll(path), "second, longer");
  EXPECT_EQ(Entries(dir.path()), 1);
}

TEST(AtomicFileTest, UncommittedWriteLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir.File("w.safetensors");
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  {
    auto f = AtomicFile::Create(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE((*f)->Write("half of the new").ok());
  }  // dropped without Commit
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_EQ(Entries(dir.path()), 1);
}

TEST(AtomicFileTest, ModeIsExactWhateverTheUmask) {
  TempDir dir;
  for (mode_t mask : {mode_t{0}, mode_t{077}}) {
    const mode_t old = ::umask(mask);
    const std::string path = dir.File(std::string("m").append(std::to_string(mask)));
    Status s = WriteFileAtomic(path, "x");
    ::umask(old);
    ASSERT_TRUE(s.ok()) << s.ToString();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0644u) << "umask " << mask;
  }
}

TEST(AtomicFileTest, LinkFolderAndMissingFolderAreRefused) {
  TempDir dir, outside;
  const std::string victim = outside.File("victim");
  ASSERT_TRUE(WriteFileAtomic(victim, "precious").ok());
  const std::string link = dir.File("link");
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  Status s = WriteFileAtomic(link, "overwrite");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  EXPECT_EQ(ReadAll(victim), "precious");

  s = WriteFileAtomic(dir.path(), "x");
  ASSERT_FALSE(s.ok());
  s = WriteFileAtomic(dir.File("sub") + "/", "x");
  ASSERT_FALSE(s.ok());
  std::filesystem::create_directory(dir.File("folder"));
  s = WriteFileAtomic(dir.File("folder"), "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is a folder"), std::string::npos) << s.ToString();
  s = WriteFileAtomic(dir.File("missing/out"), "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.ToString();
}

TEST(AtomicFileTest, CheckOutputPathNamesTheFlag) {
  TempDir dir;
  EXPECT_TRUE(CheckOutputPath(dir.File("new.json"), "--json").ok());
  Status s = CheckOutputPath(dir.File("missing/x.json"), "--json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--json"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.ToString();
  s = CheckOutputPath(dir.path(), "--save");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--save"), std::string::npos) << s.ToString();
  EXPECT_EQ(Entries(dir.path()), 0);  // a check writes nothing
}

}  // namespace
}  // namespace strata
