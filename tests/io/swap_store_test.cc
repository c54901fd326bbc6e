// SwapStore: extents round-trip through real files with every backend; the store agrees
// with an in-memory reference across writes, deletes, commits and re-opens; extents stripe
// over several folders; flipped bytes and injected faults never return wrong bytes. Bad
// folders and arguments, damaged manifests and full disks: swap_store_errors_test.cc.
#include "io/swap_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/fault_injection_backend.h"
#include "io_test_util.h"
#include "strata/log.h"
#include "tests/io/swap_store_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::FillPattern;
using testing::TempDir;
using testing::TestSeed;
using namespace swap_store_test;  // NOLINT: the store tests' shared vocabulary

class SwapStoreBackendTest : public ::testing::TestWithParam<IoBackendKind> {};

TEST_P(SwapStoreBackendTest, OddSizesRoundTripAndSurviveReopen) {
  TempDir dir;
  auto o = Options({dir.path()}, 16 * kMiB, GetParam());
  std::map<std::string, std::string> want;
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    EXPECT_FALSE(store->CommittedStep().has_value());
    for (uint64_t size : kOddSizes) {
      std::string key = "extent/" + std::to_string(size);
      want[key] = Pattern(size, size * 7 + 1);
      ASSERT_TRUE(WriteString(*store, key, want[key]).ok()) << key;
      auto got = ReadAll(*store, key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, want[key]) << key;
      EXPECT_FALSE(store->Lookup(key)->committed);
    }
    ASSERT_TRUE(store->Commit(1).ok());
    EXPECT_EQ(store->CommittedStep(), std::optional<uint64_t>(1));
    // Written after the commit: lost on re-open.
    ASSERT_TRUE(WriteString(*store, "extent/1", Pattern(99, 5)).ok());
    ASSERT_TRUE(WriteString(*store, "uncommitted", Pattern(5000, 6)).ok());
  }
  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->CommittedStep(), std::optional<uint64_t>(1));
  EXPECT_FALSE(store->Lookup("uncommitted").has_value());
  EXPECT_EQ(store->Keys().size(), want.size());
  for (const auto& [key, data] : want) {
    auto info = store->Lookup(key);
    ASSERT_TRUE(info.has_value()) << key;
    EXPECT_TRUE(info->committed);
    EXPECT_EQ(info->step, 1u);
    auto got = ReadAll(*store, key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, data) << key;
  }
}

// Random writes (odd and random sizes), reads, deletes, commits and re-opens, checked
// against a map: after a re-open the store equals the reference as of the last commit.
TEST_P(SwapStoreBackendTest, PropertyAgainstReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  TempDir a, b, c;
  auto o = Options({a.path(), b.path(), c.path()}, 24 * kMiB, GetParam(), 64 * 1024);
  std::map<std::string, std::string> current, committed;
  uint64_t step = 0;
  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  auto random_size = [&]() -> uint64_t {
    switch (rng() % 4) {
      case 0:
        return kOddSizes[rng() % std::size(kOddSizes)];
      case 1:
        return rng() % 8192;
      default:
        return rng() % (3 * kMiB / 2);
    }
  };
  for (int iter = 0; iter < 300; ++iter) {
    const std::string key = std::string("k").append(std::to_string(rng() % 12));
    const int action = static_cast<int>(rng() % 100);
    if (action < 45) {
      std::string data = Pattern(random_size(), rng());
      ASSERT_TRUE(WriteString(*store, key, data).ok()) << "iter " << iter;
      current[key] = std::move(data);
    } else if (action < 75) {
      auto got = ReadAll(*store, key);
      if (current.count(key)) {
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_EQ(*got, current[key]) << "iter " << iter << " key " << key;
      } else {
        ASSERT_EQ(got.status().code(), StatusCode::kNotFound);
      }
    } else if (action < 82) {
      Status s = store->Delete(key);
      EXPECT_EQ(s.ok(), current.erase(key) == 1) << s.ToString();
    } else if (action < 95) {
      ASSERT_TRUE(store->Commit(++step).ok());
      committed = current;
    } else {
      store.reset();
      store = MustOpen(o);
      ASSERT_TRUE(store);
      current = committed;
      EXPECT_EQ(store->CommittedStep(), step ? std::optional<uint64_t>(step) : std::nullopt);
    }
    ASSERT_LE(store->Stats().in_use_bytes, store->Stats().capacity_bytes);
  }
  store.reset();
  store = MustOpen(o);
  ASSERT_TRUE(store);
  std::vector<std::string> keys;
  for (const auto& [k, v] : committed) keys.push_back(k);
  EXPECT_EQ(store->Keys(), keys);
  for (const auto& [k, v] : committed) {
    auto got = ReadAll(*store, k);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, v) << k;
  }
}

// A batch of writes then a batch of reads, pipelined through Submit/Poll.
TEST_P(SwapStoreBackendTest, BatchedSubmitAndPoll) {
  TempDir a, b;
  auto store = MustOpen(Options({a.path(), b.path()}, 32 * kMiB, GetParam(), 128 * 1024));
  ASSERT_TRUE(store);
  constexpr int kN = 24;
  std::vector<std::unique_ptr<AlignedBuffer>> src, dst;
  std::vector<SwapOp> writes, reads;
  for (int i = 0; i < kN; ++i) {
    uint64_t size = 1000 * static_cast<uint64_t>(i) * i + static_cast<uint64_t>(i);
    src.push_back(std::make_unique<AlignedBuffer>(size));
    FillPattern(src.back()->data(), size, 100 + i);
    dst.push_back(std::make_unique<AlignedBuffer>(size));
    writes.push_back(
        SwapOp{IoOp::kWrite, std::string("b").append(std::to_string(i)), src.back()->data(), size});
    reads.push_back(
        SwapOp{IoOp::kRead, std::string("b").append(std::to_string(i)), dst.back()->data(), size});
  }
  auto wt = store->Submit(writes);
  ASSERT_TRUE(wt.ok()) << wt.status().ToString();
  std::vector<SwapCompletion> done(kN);
  size_t got = 0;
  while (got < kN) {
    auto n = store->Poll(std::span<SwapCompletion>(done).subspan(got), 1);
    ASSERT_TRUE(n.ok());
    got += *n;
  }
  for (const auto& c : done) EXPECT_TRUE(c.status.ok()) << c.key << ": " << c.status.ToString();
  EXPECT_EQ(store->Outstanding(), 0u);
  auto rt = store->Submit(reads);
  ASSERT_TRUE(rt.ok());
  auto n = store->Poll(done, kN);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, static_cast<size_t>(kN));
  for (const auto& c : done) {
    ASSERT_TRUE(c.status.ok()) << c.key << ": " << c.status.ToString();
    ASSERT_EQ(c.op, IoOp::kRead);
    int i = std::stoi(c.key.substr(1));
    EXPECT_EQ(c.ticket, (*rt)[i]);
    EXPECT_EQ(c.length, src[i]->size());
    EXPECT_EQ(std::memcmp(src[i]->data(), dst[i]->data(), src[i]->size()), 0) << c.key;
  }
  // Wait on one ticket while others are outstanding leaves the others for Poll.
  auto t1 = store->SubmitRead("b5", dst[5]->data(), dst[5]->size());
  auto t2 = store->SubmitRead("missing", dst[6]->data(), dst[6]->size());
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_TRUE(store->Wait(*t1).ok());
  EXPECT_EQ(store->Wait(*t1).code(), StatusCode::kInvalidArgument);  // already returned
  auto last = store->Poll(done, 1);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(*last, 1u);
  EXPECT_EQ(done[0].ticket, *t2);
  EXPECT_EQ(done[0].status.code(), StatusCode::kNotFound);
  EXPECT_NE(done[0].status.message().find("missing"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreBackendTest,
                         ::testing::Values(IoBackendKind::kPosix, IoBackendKind::kUring),
                         [](const auto& info) { return IoBackendKindName(info.param); });

// Two threads do I/O on one store (serialised inside it) while a third reads its metadata;
// every read returns one of the versions written to its key, intact.
TEST_P(SwapStoreBackendTest, ConcurrentUseFromSeveralThreads) {
  TempDir a, b;
  auto store = MustOpen(Options({a.path(), b.path()}, 32 * kMiB, GetParam(), 64 * 1024));
  ASSERT_TRUE(store);
  std::atomic<bool> stop{false}, wrong{false};
  std::atomic<uint64_t> commits{0};
  auto io = [&](int id) {
    std::mt19937_64 rng(id);
    AlignedBuffer src(300000), dst(300000);
    for (int i = 0; i < 150 && !wrong; ++i) {
      // Key "t<id>/<k>" is only written by thread id; its versions are (id, k, i) patterns
      // whose length encodes i.
      const int k = static_cast<int>(rng() % 4);
      const std::string key =
          std::string("t").append(std::to_string(id)).append("/").append(std::to_string(k));
      const uint64_t n = 1000 + static_cast<uint64_t>(i) * 1500;
      FillPattern(src.data(), n, id * 1000000 + k * 1000 + i);
      if (!store->Write(key, src.data(), n).ok()) wrong = true;
      auto got = store->Read(key, dst.data(), dst.size());
      if (!got.ok() || *got != n || std::memcmp(src.data(), dst.data(), n) != 0) wrong = true;
      if (id == 0 && i % 10 == 9) {
        if (store->Commit(++commits).ok() == false) wrong = true;
      }
    }
  };
  std::thread meta([&] {
    while (!stop) {
      auto st = store->Stats();
      if (st.in_use_bytes > st.capacity_bytes) wrong = true;
      for (const auto& key : store->Keys()) (void)store->Lookup(key);
      (void)store->CommittedStep();
    }
  });
  // A third thread pipelines through Submit/Poll: it must get back exactly its own
  // tickets, never those the synchronous calls of the others wait for.
  std::atomic<bool> stolen{false};
  auto async_io = [&] {
    std::vector<std::unique_ptr<AlignedBuffer>> bufs;
    std::vector<SwapOp> ops;
    for (int k = 0; k < 6; ++k) {
      bufs.push_back(std::make_unique<AlignedBuffer>(50000));
      FillPattern(bufs.back()->data(), 50000, 7000 + k);
      ops.push_back(SwapOp{IoOp::kWrite, "async/" + std::to_string(k), bufs.back()->data(), 50000});
    }
    for (int round = 0; round < 20 && !wrong; ++round) {
      auto tickets = store->Submit(ops);
      if (!tickets.ok()) {
        wrong = true;
        return;
      }
      std::set<SwapTicket> mine(tickets->begin(), tickets->end());
      std::vector<SwapCompletion> done(ops.size());
      size_t got = 0;
      while (got < ops.size()) {
        auto n = store->Poll(std::span<SwapCompletion>(done).subspan(got), 1);
        if (!n.ok() || *n == 0) {
          wrong = true;
          return;
        }
        for (size_t i = got; i < got + *n; ++i) {
          if (!mine.count(done[i].ticket) || !done[i].status.ok()) stolen = true;
        }
        got += *n;
      }
    }
  };
  std::thread t0(io, 0), t1(io, 1), t2(async_io);
  t0.join();
  t1.join();
  t2.join();
  stop = true;
  meta.join();
  EXPECT_FALSE(wrong);
  EXPECT_FALSE(stolen);
  EXPECT_EQ(store->Stats().writes, 300u + 120u);
  EXPECT_EQ(store->Keys().size(), 8u + 6u);
}

TEST(SwapStoreTest, LargeExtentIsStripedOverEveryFolder) {
  TempDir a, b, c;
  constexpr uint64_t kStripe = 64 * 1024;
  auto store =
      MustOpen(Options({a.path(), b.path(), c.path()}, 8 * kMiB, IoBackendKind::kPosix, kStripe));
  ASSERT_TRUE(store);
  std::string data = Pattern(kMiB, 42);
  ASSERT_TRUE(WriteString(*store, "big", data).ok());
  ASSERT_TRUE(store->Commit(1).ok());
  auto stats = store->Stats();
  ASSERT_EQ(stats.paths.size(), 3u);
  uint64_t sum = 0;
  for (const auto& p : stats.paths) {
    // 16 stripes over 3 files: 6, 5 and 5 stripes.
    EXPECT_GE(p.bytes_written, 5 * kStripe) << p.data_file;
    sum += p.bytes_written;
  }
  EXPECT_EQ(sum, kMiB);
  // The bytes really are in the files, stripe s in file s % 3 at (s / 3) * stripe.
  for (uint64_t s = 0; s < kMiB / kStripe; ++s) {
    const std::string& file = stats.paths[s % 3].data_file;
    int fd = ::open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << file;
    std::string got(kStripe, '\0');
    ASSERT_EQ(::pread(fd, got.data(), kStripe, static_cast<off_t>((s / 3) * kStripe)),
              static_cast<ssize_t>(kStripe));
    ::close(fd);
    EXPECT_EQ(got, data.substr(s * kStripe, kStripe)) << "stripe " << s << " in " << file;
  }
  auto got = ReadAll(*store, "big");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, data);
}

// StateFileNames is what a copy of a closed run takes (the Python layer's checkpoints): the
// store's files in each folder are those, its lock and its stripe marker (remade where a copy
// has none), and those alone, copied into new folders, open as the same run with the same
// bytes.
TEST(SwapStoreTest, StateFileNamesAreTheWholeCommittedRun) {
  TempDir a, b, copy_a, copy_b;
  const std::string data = Pattern(3 * kMiB + 7, 5);
  {
    auto store = MustOpen(Options({a.path(), b.path()}, 8 * kMiB, IoBackendKind::kPosix, kMiB));
    ASSERT_TRUE(store);
    ASSERT_TRUE(WriteString(*store, "x", data).ok());
    ASSERT_TRUE(store->Commit(1).ok());
  }
  const std::vector<std::string> from = {a.path(), b.path()}, to = {copy_a.path(), copy_b.path()};
  for (size_t i = 0; i < from.size(); ++i) {
    const std::vector<std::string> names = SwapStore::StateFileNames(i, from.size());
    std::vector<std::string> present;
    for (const auto& e : std::filesystem::directory_iterator(from[i])) {
      present.push_back(e.path().filename().string());
    }
    std::vector<std::string> expected = names;
    expected.push_back("strata.lock");
    expected.push_back("strata.stripe");
    std::sort(present.begin(), present.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(present, expected) << "folder " << i;
    for (const std::string& n : names) {
      std::filesystem::copy_file(from[i] + "/" + n, to[i] + "/" + n);
    }
  }
  EXPECT_EQ(SwapStore::StateFileNames(0, 2).front(), "strata.manifest");
  auto copied = MustOpen(Options(to, 0, IoBackendKind::kPosix, kMiB));
  ASSERT_TRUE(copied);
  EXPECT_EQ(copied->CommittedStep(), std::optional<uint64_t>(1));
  auto got = ReadAll(*copied, "x");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, data);
}

TEST(SwapStoreTest, FlippedByteOnDiskIsCorruptionNamingKeyPathAndOffset) {
  TempDir dir;
  auto o = Options({dir.path()}, 4 * kMiB);
  std::string file;
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    ASSERT_TRUE(WriteString(*store, "first", Pattern(8192, 1)).ok());
    ASSERT_TRUE(WriteString(*store, "block3/exp_avg", Pattern(10000, 2)).ok());
    ASSERT_TRUE(store->Commit(7).ok());
    file = store->Stats().paths[0].data_file;
  }
  // "first" occupies [0, 8192), so "block3/exp_avg" starts at 8192; damage its tail block
  // (the one written through the bounce block).
  int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  ASSERT_EQ(::pread(fd, &byte, 1, 8192 + 9000), 1);
  byte ^= 0x20;
  ASSERT_EQ(::pwrite(fd, &byte, 1, 8192 + 9000), 1);
  ::close(fd);

  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  auto ok = ReadAll(*store, "first");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, Pattern(8192, 1));
  auto bad = ReadAll(*store, "block3/exp_avg");
  ASSERT_FALSE(bad.ok());
  const Status& s = bad.status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(s.path(), file);
  EXPECT_EQ(s.offset(), std::optional<uint64_t>(8192));
  EXPECT_NE(s.message().find("'block3/exp_avg'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(file + " offset 8192"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("step 7"), std::string::npos) << s.message();
  // The bytes of the damaged extent are not "fixed" by the store: rewriting heals it.
  ASSERT_TRUE(WriteString(*store, "block3/exp_avg", Pattern(10000, 3)).ok());
  auto healed = ReadAll(*store, "block3/exp_avg");
  ASSERT_TRUE(healed.ok());
  EXPECT_EQ(*healed, Pattern(10000, 3));
}

TEST(SwapStoreTest, DeleteTakesEffectAtCommit) {
  TempDir dir;
  auto o = Options({dir.path()}, 4 * kMiB);
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    ASSERT_TRUE(WriteString(*store, "a", Pattern(100, 1)).ok());
    ASSERT_TRUE(WriteString(*store, "b", Pattern(100, 2)).ok());
    ASSERT_TRUE(store->Commit(1).ok());
    ASSERT_TRUE(store->Delete("a").ok());
    EXPECT_EQ(store->Delete("a").code(), StatusCode::kNotFound);
    EXPECT_EQ(ReadAll(*store, "a").status().code(), StatusCode::kNotFound);
  }
  {
    auto store = MustOpen(o);  // the delete was not committed
    ASSERT_TRUE(store);
    EXPECT_EQ(store->Keys(), (std::vector<std::string>{"a", "b"}));
    ASSERT_TRUE(store->Delete("a").ok());
    ASSERT_TRUE(store->Commit(2).ok());
    EXPECT_EQ(store->Stats().committed_bytes, 4096u);
  }
  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->Keys(), (std::vector<std::string>{"b"}));
  EXPECT_EQ(store->Commit(2).code(), StatusCode::kInvalidArgument);  // steps increase
}

// ReadCommitted reads the committed version beside a pending one (NotFound before any
// commit); Revert drops the pending version, frees its space and shows the committed one (or
// none) again, across a reopen too. The engine's redo of speculative updates uses both.
TEST(SwapStoreTest, ReadCommittedAndRevertSeeThroughThePendingVersion) {
  TempDir dir;
  auto o = Options({dir.path()}, 4 * kMiB);
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    ASSERT_TRUE(WriteString(*store, "a", Pattern(5000, 1)).ok());
    ASSERT_TRUE(WriteString(*store, "new", Pattern(100, 9)).ok());
    AlignedBuffer buf(8192);
    EXPECT_EQ(store->ReadCommitted("a", buf.data(), 8192).status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(store->Commit(1).ok());
    ASSERT_TRUE(WriteString(*store, "a", Pattern(3000, 2)).ok());
    EXPECT_EQ(*ReadAll(*store, "a"), Pattern(3000, 2));  // the newest
    auto got = store->ReadCommitted("a", buf.data(), 8192);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(std::string(buf.data(), *got), Pattern(5000, 1));
    const uint64_t in_use = store->Stats().in_use_bytes;
    store->Revert("a");
    EXPECT_EQ(store->Stats().in_use_bytes, in_use - 4096);  // the pending version's space
    EXPECT_EQ(*ReadAll(*store, "a"), Pattern(5000, 1));
    ASSERT_TRUE(WriteString(*store, "b", Pattern(10, 3)).ok());
    store->Revert("b");  // never committed: gone
    EXPECT_EQ(ReadAll(*store, "b").status().code(), StatusCode::kNotFound);
    store->Revert("missing");  // a no-op
    ASSERT_TRUE(store->Commit(2).ok());
  }
  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->Keys(), (std::vector<std::string>{"a", "new"}));
  EXPECT_EQ(*ReadAll(*store, "a"), Pattern(5000, 1));
}

// Superseded versions are released at commit: a store about twice its live data (a new
// version is written beside each committed one) keeps taking new versions step after step,
// and runs out when it is not committed.
TEST(SwapStoreTest, SupersededSpaceIsReusedAfterCommit) {
  TempDir dir;
  auto o = Options({dir.path()}, 7 * kMiB);
  std::map<std::string, std::string> committed;
  const uint64_t live = 3 * kMiB - 3 * 4096;
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store);
    for (uint64_t step = 1; step <= 60; ++step) {
      for (int k = 0; k < 3; ++k) {
        std::string key = "k" + std::to_string(k);
        std::string data = Pattern(kMiB - 4096 * k, step * 10 + k);
        ASSERT_TRUE(WriteString(*store, key, data).ok()) << "step " << step << " " << key;
        // The pending version reads back while the committed one still occupies space.
        auto got = ReadAll(*store, key);
        ASSERT_TRUE(got.ok());
        ASSERT_EQ(*got, data);
        if (step < 60) committed[key] = data;
      }
      auto st = store->Stats();
      EXPECT_EQ(st.in_use_bytes, (step == 1 ? 0 : live) + live) << "step " << step;
      if (step == 60) break;  // leaves the step's writes pending
      ASSERT_TRUE(store->Commit(step).ok());
      st = store->Stats();
      EXPECT_EQ(st.in_use_bytes, st.committed_bytes);
      EXPECT_EQ(st.committed_bytes, live);
    }
    // The files never grew beyond their preallocation.
    for (const auto& p : store->Stats().paths) {
      struct stat fst {};
      ASSERT_EQ(::stat(p.data_file.c_str(), &fst), 0);
      EXPECT_EQ(static_cast<uint64_t>(fst.st_size), 7 * kMiB) << p.data_file;
    }
    // Without a commit the committed versions keep their space: room for one more extent.
    ASSERT_TRUE(WriteString(*store, "extra1", Pattern(kMiB, 1)).ok());
    Status s = WriteString(*store, "extra2", Pattern(kMiB, 2));
    ASSERT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
    EXPECT_NE(s.message().find("'extra2'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("Commit"), std::string::npos) << s.message();
    EXPECT_FALSE(store->Lookup("extra2").has_value());
    auto got = ReadAll(*store, "extra1");
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, Pattern(kMiB, 1));
  }
  auto store = MustOpen(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->CommittedStep(), std::optional<uint64_t>(59));
  EXPECT_EQ(store->Stats().in_use_bytes, live);
  for (const auto& [k, v] : committed) {
    auto got = ReadAll(*store, k);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, v) << k;
  }
}

// Holds back the completions of reads until Release(): a read that the kernel has not
// finished yet, for as long as the test needs. Everything else is forwarded.
class HoldReadsBackend final : public IoBackend {
 public:
  explicit HoldReadsBackend(std::unique_ptr<IoBackend> inner) : inner_(std::move(inner)) {}
  std::string_view Name() const override { return "hold-reads"; }
  uint32_t Capabilities() const override { return inner_->Capabilities(); }
  uint32_t QueueDepth() const override { return inner_->QueueDepth(); }
  Result<int> OpenFile(const std::string& path, const OpenOptions& options) override {
    return inner_->OpenFile(path, options);
  }
  Status CloseFile(int file) override { return inner_->CloseFile(file); }
  bool IsDirect(int file) const override { return inner_->IsDirect(file); }
  Status Allocate(int file, uint64_t bytes) override { return inner_->Allocate(file, bytes); }
  Status Sync(int file) override { return inner_->Sync(file); }
  Status Submit(std::span<const IoRequest> requests) override {
    for (const auto& r : requests) {
      if (r.op == IoOp::kRead) reads_.insert(r.user_data);
    }
    return inner_->Submit(requests);
  }
  Result<size_t> Poll(std::span<IoCompletion> out, size_t min_complete) override {
    size_t n = 0;
    while (!released_.empty() && n < out.size()) {
      out[n++] = std::move(released_.front());
      released_.pop_front();
    }
    if (n > 0 || inner_->InFlight() == 0) return n;
    std::vector<IoCompletion> got(out.size());
    STRATA_ASSIGN_OR_RETURN(size_t m, inner_->Poll(got, min_complete));
    for (size_t i = 0; i < m; ++i) {
      if (hold_ && reads_.count(got[i].user_data)) {
        held_.push_back(std::move(got[i]));
      } else {
        out[n++] = std::move(got[i]);
      }
    }
    return n;
  }
  size_t InFlight() const override { return inner_->InFlight() + held_.size() + released_.size(); }
  void Release() {
    hold_ = false;
    for (auto& c : held_) released_.push_back(std::move(c));
    held_.clear();
  }
  size_t held() const { return held_.size(); }

 private:
  std::unique_ptr<IoBackend> inner_;
  bool hold_ = true;
  std::set<uint64_t> reads_;
  std::vector<IoCompletion> held_;
  std::deque<IoCompletion> released_;
};

// A read in flight keeps its version's space from being reused by later writes.
TEST(SwapStoreTest, ReadInFlightPinsItsVersion) {
  TempDir dir;
  IoBackendOptions bo;
  bo.kind = IoBackendKind::kPosix;
  auto inner = CreateIoBackend(bo);
  ASSERT_TRUE(inner.ok());
  auto hold = std::make_unique<HoldReadsBackend>(std::move(inner).value());
  HoldReadsBackend* gate = hold.get();
  auto store = MustOpen(Options({dir.path()}, 2 * kMiB), std::move(hold));
  ASSERT_TRUE(store);
  std::string v1 = Pattern(kMiB, 1);
  ASSERT_TRUE(WriteString(*store, "x", v1).ok());
  AlignedBuffer dst(kMiB), src(kMiB);
  auto r = store->SubmitRead("x", dst.data(), kMiB);
  ASSERT_TRUE(r.ok());
  FillPattern(src.data(), kMiB, 2);
  ASSERT_TRUE(store->Write("x", src.data(), kMiB).ok());  // supersedes the pending v1
  // v1 is pinned by the read: a third version must not land on it.
  FillPattern(src.data(), kMiB, 3);
  Status s = store->Write("x", src.data(), kMiB);
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
  EXPECT_EQ(store->Outstanding(), 1u);  // the read: in the kernel or held back
  gate->Release();
  ASSERT_TRUE(store->Wait(*r).ok());
  EXPECT_EQ(std::string(dst.data(), kMiB), v1);
  ASSERT_TRUE(store->Write("x", src.data(), kMiB).ok());  // v1's space is free now
  auto got = ReadAll(*store, "x");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, std::string(src.data(), kMiB));
}

TEST(SwapStoreTest, StatsCountBytes) {
  TempDir a, b;
  auto store = MustOpen(Options({a.path(), b.path()}, 8 * kMiB, IoBackendKind::kPosix, 64 * 1024));
  ASSERT_TRUE(store);
  ASSERT_TRUE(WriteString(*store, "x", Pattern(100000, 1)).ok());
  ASSERT_TRUE(ReadAll(*store, "x").ok());
  ASSERT_TRUE(ReadAll(*store, "x").ok());
  auto st = store->Stats();
  EXPECT_EQ(st.bytes_written, 100000u);
  EXPECT_EQ(st.bytes_read, 200000u);
  EXPECT_EQ(st.writes, 1u);
  EXPECT_EQ(st.reads, 2u);
  EXPECT_EQ(st.in_use_bytes, 102400u);
  EXPECT_EQ(st.committed_bytes, 0u);
  EXPECT_EQ(st.extents, 1u);
  EXPECT_EQ(st.capacity_bytes, 8 * kMiB);
  EXPECT_FALSE(st.backend.empty());
  ASSERT_EQ(st.paths.size(), 2u);
  EXPECT_EQ(st.paths[0].bytes_written + st.paths[1].bytes_written, 102400u);
  EXPECT_EQ(st.paths[0].bytes_read + st.paths[1].bytes_read, 204800u);
  EXPECT_EQ(st.paths[0].file_bytes, 4 * kMiB);
  EXPECT_TRUE(st.paths[0].direct);  // /var/tmp is ext4
  EXPECT_GT(st.paths[0].fs_free_bytes, 0u);
  struct stat fst {};
  ASSERT_EQ(::stat(st.paths[1].data_file.c_str(), &fst), 0);
  EXPECT_EQ(static_cast<uint64_t>(fst.st_size), 4 * kMiB);
  EXPECT_GE(static_cast<uint64_t>(fst.st_blocks) * 512, 4 * kMiB);  // preallocated
}

// Each injected fault yields intact data or a non-OK status, never wrong bytes; the
// committed state survives it all.
TEST_P(SwapStoreBackendTest, FaultInjectionNeverReturnsWrongBytes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  TempDir a, b;
  auto o = Options({a.path(), b.path()}, 32 * kMiB, GetParam(), 64 * 1024);
  FaultInjectionOptions f;
  f.seed = seed;
  f.eio = 0.03;
  f.enospc = 0.03;
  f.short_transfer = 0.1;
  f.eagain = 0.1;
  f.delay = 0.02;
  f.delay_us = 50;
  f.flip_read = 0.03;
  f.flip_write = 0.02;
  FaultInjectionBackend* fault = nullptr;
  auto store = OpenFaulty(o, f, &fault);
  ASSERT_TRUE(store);
  std::map<std::string, std::string> current, committed;
  uint64_t step = 0, failed_writes = 0, bad_reads = 0, corrupt_reads = 0, good_reads = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const std::string key = std::string("f").append(std::to_string(rng() % 10));
    const int action = static_cast<int>(rng() % 100);
    if (action < 45) {
      std::string data = Pattern(rng() % 2 ? rng() % 300000 : kOddSizes[rng() % 8], rng());
      Status s = WriteString(*store, key, data);
      if (s.ok()) {
        current[key] = std::move(data);
      } else {
        ++failed_writes;
        EXPECT_TRUE(s.code() == StatusCode::kIOError || s.code() == StatusCode::kNoSpace)
            << s.ToString();
      }
    } else if (action < 90) {
      if (!current.count(key)) continue;
      auto got = ReadAll(*store, key);
      if (got.ok()) {
        ++good_reads;
        ASSERT_EQ(*got, current[key]) << "wrong bytes for " << key << " at iter " << iter;
      } else {
        ++bad_reads;
        corrupt_reads += got.status().IsCorruption();
        if (got.status().IsCorruption()) {
          EXPECT_NE(got.status().message().find("'" + key + "'"), std::string::npos);
        }
      }
    } else {
      ASSERT_TRUE(store->Commit(++step).ok());
      committed = current;
    }
  }
  const FaultCounters counters = fault->counters();
  EXPECT_GT(counters.total(), 0u);
  EXPECT_GT(good_reads, 0u);
  if (counters.flipped_reads > 0) {
    EXPECT_GT(corrupt_reads, 0u);
  }
  if (counters.eio + counters.enospc > 0) {
    EXPECT_GT(failed_writes + bad_reads, 0u);
  }
  std::printf(
      "faults: eio %llu enospc %llu short %llu eagain %llu flips r/w %llu/%llu; "
      "failed writes %llu, failed reads %llu (corrupt %llu), good reads %llu\n",
      (unsigned long long)counters.eio, (unsigned long long)counters.enospc,
      (unsigned long long)counters.short_transfers, (unsigned long long)counters.eagain,
      (unsigned long long)counters.flipped_reads, (unsigned long long)counters.flipped_writes,
      (unsigned long long)failed_writes, (unsigned long long)bad_reads,
      (unsigned long long)corrupt_reads, (unsigned long long)good_reads);
  store.reset();
  // Clean backend: the committed versions, byte for byte, or Corruption where a flipped
  // bit was written to the file.
  store = MustOpen(o);
  ASSERT_TRUE(store);
  uint64_t corrupt = 0;
  for (const auto& [k, v] : committed) {
    auto got = ReadAll(*store, k);
    if (got.ok()) {
      EXPECT_EQ(*got, v) << k;
    } else {
      EXPECT_TRUE(got.status().IsCorruption()) << got.status().ToString();
      ++corrupt;
    }
  }
  EXPECT_LE(corrupt, counters.flipped_writes);
  EXPECT_EQ(store->Keys().size(), committed.size());
}

}  // namespace
}  // namespace strata
