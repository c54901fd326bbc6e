// StoreReader against a SwapStore written by the store itself: odd extent sizes striped over
// two folders, every backend; the bytes read equal the bytes written, pieces arrive in
// order, nothing on disk changes, a flipped bit is named with its file and offset, and a
// store a live SwapStore holds is refused.
#include "strata/store_reader.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "tests/io/swap_store_util.h"
#include "tests/temp_dir.h"

namespace strata {
namespace {

using swap_store_test::kOddSizes;
using swap_store_test::MustOpen;
using swap_store_test::Options;
using swap_store_test::Pattern;
using swap_store_test::WriteString;

std::map<std::string, std::pair<std::string, int64_t>> Snapshot(const std::string& dir) {
  std::map<std::string, std::pair<std::string, int64_t>> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    struct stat st {};
    ::stat(e.path().c_str(), &st);
    out[e.path().string()] = {std::string(std::istreambuf_iterator<char>(f), {}),
                              int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
  return out;
}

class StoreReaderTest : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    folders_ = {tmp_.File("a"), tmp_.File("b")};
    for (const auto& f : folders_) std::filesystem::create_directories(f);
    auto store = MustOpen(Options(folders_, 16 << 20, IoBackendKind::kPosix, 64 << 10));
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < std::size(kOddSizes); ++i) {
      const std::string key = "k" + std::to_string(i);
      want_[key] = Pattern(kOddSizes[i], i + 1);
      ASSERT_TRUE(WriteString(*store, key, want_[key]).ok());
    }
    ASSERT_TRUE(store->Commit(7).ok());
  }

  Result<std::unique_ptr<StoreReader>> Open(uint64_t request = 16 << 10) {
    StoreReaderOptions o;
    o.io.kind = GetParam();
    o.io.queue_depth = 4;
    o.request_bytes = request;
    return StoreReader::Open(folders_, o);
  }

  testing::TempDir tmp_{"strata-store-reader"};
  std::vector<std::string> folders_;
  std::map<std::string, std::string> want_;
};

TEST_P(StoreReaderTest, ReadsEveryExtentInOrderAndChangesNothing) {
  const auto before = Snapshot(tmp_.path());
  {
    auto r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->step(), 7u);
    EXPECT_TRUE((*r)->problems().empty());
    ASSERT_EQ((*r)->extents().size(), want_.size());
    std::vector<std::string> keys;
    for (const auto& [k, v] : want_) keys.push_back(k);
    std::vector<std::string> got(keys.size());
    Status s = (*r)->Read(keys, [&](size_t i, uint64_t offset, std::span<const uint8_t> b) {
      EXPECT_EQ(offset, got[i].size()) << keys[i];  // front to back
      got[i].append(reinterpret_cast<const char*>(b.data()), b.size());
      return Status::OK();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(got[i], want_[keys[i]]) << keys[i];
  }
  EXPECT_TRUE(before == Snapshot(tmp_.path()));
}

TEST_P(StoreReaderTest, AFlippedBitIsNamedWithItsFileAndOffsetAndTheOthersStillRead) {
  StoreExtentInfo bad;
  {
    auto r = Open();
    ASSERT_TRUE(r.ok());
    bad = *(*r)->Find("k7");  // 1 MiB + 7 bytes: striped over both files
  }
  {
    std::fstream f(bad.file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(bad.file_offset + 3));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(std::streamoff(bad.file_offset + 3));
    f.write(&c, 1);
  }
  auto r = Open();
  ASSERT_TRUE(r.ok());
  std::vector<std::string> keys;
  for (const auto& [k, v] : want_) keys.push_back(k);
  std::vector<Status> found;
  Status s = (*r)->Read(
      keys, [](size_t, uint64_t, std::span<const uint8_t>) { return Status::OK(); },
      [&](size_t, const Status& st) { found.push_back(st); });
  EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].code(), StatusCode::kCorruption);
  EXPECT_EQ(found[0].path(), bad.file);
  EXPECT_EQ(found[0].offset(), bad.file_offset);
  EXPECT_NE(found[0].message().find("k7"), std::string::npos) << found[0].message();
  // Without on_bad the first corruption stops the read.
  Status stop =
      (*r)->Read(keys, [](size_t, uint64_t, std::span<const uint8_t>) { return Status::OK(); });
  EXPECT_EQ(stop.code(), StatusCode::kCorruption);
}

TEST_P(StoreReaderTest, AStoreALiveProcessHoldsIsRefused) {
  auto live = MustOpen(Options(folders_, 0, IoBackendKind::kPosix));
  ASSERT_NE(live, nullptr);
  auto r = Open();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("in use by a live process"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreReaderTest,
                         ::testing::Values(IoBackendKind::kPosix, IoBackendKind::kAuto),
                         [](const auto& info) {
                           return std::string(IoBackendKindName(info.param));
                         });

}  // namespace
}  // namespace strata
