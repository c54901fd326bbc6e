// InputFile / ReadInputFile (strata/input_file.h): a regular file is read whole, through a
// symbolic link too; a folder, a character device, a FIFO with no writer (without blocking)
// and a socket are refused naming what they are; the size bound holds for what fstat says and
// for what a read returns (/proc files say 0); a missing file is NotFound naming the path.
#include "strata/input_file.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/temp_dir.h"

namespace strata {
namespace {

bool Has(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

class InputFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = tmp_.File(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  testing::TempDir tmp_{"strata-input-file"};
};

TEST_F(InputFileTest, ReadsARegularFileWholeAndThroughALink) {
  for (const size_t size :
       {size_t{0}, size_t{1}, size_t{17}, size_t{65536}, size_t{65536 * 3 + 7}}) {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 131 + 7);
    const std::string path = Write(std::string("f").append(std::to_string(size)), bytes);
    auto read = ReadInputFile(path, "--x", size);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(*read, bytes) << size;
    const std::string link = tmp_.File("l" + std::to_string(size));
    std::filesystem::create_symlink(path, link);
    auto linked = ReadInputFile(link, "--x");
    ASSERT_TRUE(linked.ok()) << linked.status().ToString();
    EXPECT_EQ(*linked, bytes);
    auto file = InputFile::Open(path, "--x");
    ASSERT_TRUE(file.ok());
    EXPECT_EQ(file->size(), size);
    if (size >= 17) {
      char part[10];
      ASSERT_TRUE(file->ReadAt(7, part, sizeof part).ok());
      EXPECT_EQ(std::string(part, sizeof part), bytes.substr(7, 10));
      const Status past = file->ReadAt(size - 3, part, sizeof part);
      EXPECT_EQ(past.code(), StatusCode::kCorruption) << past.ToString();
    }
  }
}

TEST_F(InputFileTest, RefusesWhatIsNotARegularFileWithoutBlocking) {
  const std::string fifo = tmp_.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string sock = tmp_.File("sock");
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::pair<std::string, std::string> cases[] = {{tmp_.path(), "a folder"},
                                                       {"/dev/zero", "a character device"},
                                                       {fifo, "a FIFO (named pipe)"}};
  for (const auto& [path, kind] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = ReadInputFile(path, "--config");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << path;
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_TRUE(Has(r.status(), "--config " + path + " is " + kind + ", not a regular file"))
        << r.status().ToString();
    EXPECT_EQ(r.status().path(), path);
  }
  // A socket cannot be opened at all (ENXIO): still an error naming it.
  auto r = ReadInputFile(sock, "--config");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Has(r.status(), "--config " + sock)) << r.status().ToString();
  ::close(s);
}

TEST_F(InputFileTest, TheSizeBoundHoldsForFstatAndForReads) {
  const std::string path = Write("big", std::string(4097, 'x'));
  auto over = ReadInputFile(path, "--io-config", 4096);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(over.status(), "--io-config " + path +
                                     " is 4.0 KiB (4097 bytes), over the "
                                     "4.0 KiB (4096 bytes)"))
      << over.status().ToString();
  EXPECT_TRUE(ReadInputFile(path, "--io-config", 4097).ok());
  // /proc files say 0 bytes; what is read still counts.
  auto proc = ReadInputFile("/proc/self/maps", "--x", 16);
  ASSERT_FALSE(proc.ok());
  EXPECT_TRUE(Has(proc.status(), "holds more than the 16 B")) << proc.status().ToString();
}

TEST_F(InputFileTest, AMissingFileIsNotFoundNamingThePath) {
  const std::string path = tmp_.File("missing");
  auto r = ReadInputFile(path, "--init");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Has(r.status(), "--init " + path + ": open")) << r.status().ToString();
}

}  // namespace
}  // namespace strata
