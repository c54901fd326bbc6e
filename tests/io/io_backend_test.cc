// The IoBackend conformance suite: every test runs against every backend and flag
// combination (posix buffered/direct; io_uring × direct × fixed buffers × fixed files ×
// sqpoll). Combinations the kernel refuses are skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/uring_backend.h"
#include "strata/io.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::TempDir;

struct Config {
  IoBackendKind kind;
  bool direct;
  bool fixed_buffers;
  bool fixed_files;
  bool sqpoll;
};

std::string ConfigName(const ::testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  std::string n = c.kind == IoBackendKind::kPosix ? "posix" : "uring";
  n += c.direct ? "_direct" : "_buffered";
  if (c.kind == IoBackendKind::kUring) {
    n += c.fixed_buffers ? "_fixedbuf" : "_plainbuf";
    n += c.fixed_files ? "_fixedfile" : "_plainfile";
    n += c.sqpoll ? "_sqpoll" : "";
  }
  return n;
}

std::vector<Config> AllConfigs() {
  std::vector<Config> v;
  for (bool direct : {false, true})
    v.push_back({IoBackendKind::kPosix, direct, false, false, false});
  for (bool direct : {false, true})
    for (bool fb : {false, true})
      for (bool ff : {false, true})
        for (bool sq : {false, true}) v.push_back({IoBackendKind::kUring, direct, fb, ff, sq});
  return v;
}

class IoBackendConformance : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const Config& c = GetParam();
    IoBackendOptions o;
    o.kind = c.kind;
    o.queue_depth = 8;
    o.direct = c.direct;
    o.fixed_buffers = c.fixed_buffers;
    o.fixed_files = c.fixed_files;
    o.sqpoll = c.sqpoll;
    Result<std::unique_ptr<IoBackend>> b = CreateIoBackend(o);
    if (!b.ok() && b.status().IsNotSupported()) {
      GTEST_SKIP() << "backend not available here: " << b.status().ToString();
    }
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    if (c.fixed_files && c.kind == IoBackendKind::kUring &&
        !(backend_->Capabilities() & kIoCapFixedFiles)) {
      GTEST_SKIP() << "this kernel refuses a registered file table";
    }
  }

  // Opens (creating) a file in the test folder and reserves `size` bytes.
  int Open(const std::string& name, uint64_t size) {
    Result<int> f = backend_->OpenFile(dir_.File(name),
                                       OpenOptions{.create = true, .direct = GetParam().direct});
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return -1;
    EXPECT_EQ(backend_->IsDirect(*f), GetParam().direct);
    Status s = backend_->Allocate(*f, size);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return *f;
  }

  TempDir dir_;
  std::unique_ptr<IoBackend> backend_;
};

TEST_P(IoBackendConformance, ReportsCapabilities) {
  const uint32_t caps = backend_->Capabilities();
  EXPECT_TRUE(caps & kIoCapAsync);
  EXPECT_EQ(bool(caps & kIoCapDirect), GetParam().direct);
  EXPECT_EQ(backend_->QueueDepth(), 8u);
  if (GetParam().kind == IoBackendKind::kUring) {
    EXPECT_EQ(backend_->Name(), "io_uring");
    EXPECT_EQ(bool(caps & kIoCapSqpoll), GetParam().sqpoll);
    EXPECT_EQ(bool(caps & kIoCapFixedBuffers), GetParam().fixed_buffers);
  } else {
    EXPECT_EQ(backend_->Name(), "posix");
  }
}

TEST_P(IoBackendConformance, WritesThenReadsBackMoreRequestsThanTheQueueHolds) {
  constexpr uint64_t kBlock = 256 * 1024, kBlocks = 40;  // 5× the queue depth
  const int f = Open("data", kBlock * kBlocks);
  AlignedBuffer src(kBlock * kBlocks), dst(kBlock * kBlocks);
  testing::FillPattern(src.data(), src.size(), 42);
  BufferRegion regions[] = {{src.data(), src.size()}, {dst.data(), dst.size()}};
  ASSERT_TRUE(backend_->RegisterBuffers(regions).ok());
  std::vector<IoRequest> reqs;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    reqs.push_back({IoOp::kWrite, f, i * kBlock, src.data() + i * kBlock, kBlock, i});
  }
  ASSERT_TRUE(backend_->Submit(reqs).ok());
  EXPECT_EQ(backend_->InFlight(), kBlocks);
  std::vector<IoCompletion> out(kBlocks);
  std::vector<bool> seen(kBlocks, false);
  size_t got = 0;
  while (got < kBlocks) {
    Result<size_t> n = backend_->Poll(std::span<IoCompletion>(out).subspan(got), 1);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_GE(*n, 1u);
    for (size_t i = got; i < got + *n; ++i) {
      ASSERT_TRUE(out[i].status.ok()) << out[i].status.ToString();
      ASSERT_LT(out[i].user_data, kBlocks);
      EXPECT_FALSE(seen[out[i].user_data]) << "completion returned twice";
      seen[out[i].user_data] = true;
    }
    got += *n;
  }
  EXPECT_EQ(backend_->InFlight(), 0u);
  ASSERT_TRUE(backend_->Sync(f).ok());
  for (auto& r : reqs) {
    r.op = IoOp::kRead;
    r.buffer = dst.data() + r.offset;
  }
  Status s = backend_->RunSync(reqs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  if (auto* u = dynamic_cast<UringBackend*>(backend_.get())) {
    if (GetParam().fixed_buffers) {
      EXPECT_GT(u->fixed_buffer_ops(), 0u) << "registered buffers were not used";
    } else {
      EXPECT_EQ(u->fixed_buffer_ops(), 0u);
    }
  }
  EXPECT_TRUE(backend_->CloseFile(f).ok());
}

TEST_P(IoBackendConformance, OddSizesAndOffsets) {
  const bool direct = GetParam().direct;
  const int f = Open("odd", 4 << 20);
  // Buffered files take any size and offset; direct files take multiples of 4096 only.
  const std::vector<uint64_t> sizes =
      direct ? std::vector<uint64_t>{0, 4096, 3 * 4096, (1 << 20) + 4096}
             : std::vector<uint64_t>{0, 1, 15, 17, 1023, (1 << 20) + 7};
  const std::vector<uint64_t> offsets =
      direct ? std::vector<uint64_t>{0, 4096, 12288} : std::vector<uint64_t>{0, 1, 4095, 12289};
  AlignedBuffer src((1 << 20) + 8192 + 64), dst((1 << 20) + 8192 + 64);
  uint64_t seed = 1;
  for (uint64_t size : sizes) {
    for (uint64_t off : offsets) {
      SCOPED_TRACE("size " + std::to_string(size) + " offset " + std::to_string(off));
      // Unaligned buffer addresses too, where the file allows them.
      char* s = src.data() + (direct ? 0 : 3);
      char* d = dst.data() + (direct ? 0 : 5);
      testing::FillPattern(s, size, ++seed);
      std::memset(d, 0xEE, size + 1);
      IoRequest w{IoOp::kWrite, f, off, s, size, 1};
      ASSERT_TRUE(backend_->RunSync({&w, 1}).ok());
      IoRequest r{IoOp::kRead, f, off, d, size, 2};
      Status st = backend_->RunSync({&r, 1});
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(std::memcmp(s, d, size), 0);
      EXPECT_EQ(static_cast<unsigned char>(d[size]), 0xEE) << "read wrote past its length";
    }
  }
}

TEST_P(IoBackendConformance, MisalignedDirectRequestIsInvalidArgument) {
  if (!GetParam().direct) GTEST_SKIP() << "buffered files accept any alignment (tested above)";
  const int f = Open("misaligned", 1 << 20);
  AlignedBuffer buf(1 << 20);
  const IoRequest bad[] = {
      {IoOp::kRead, f, 100, buf.data(), 4096, 1},      // offset
      {IoOp::kWrite, f, 0, buf.data(), 4000, 2},       // length
      {IoOp::kRead, f, 0, buf.data() + 512, 4096, 3},  // buffer address
  };
  for (const IoRequest& r : bad) {
    Status s = backend_->Submit({&r, 1});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("4096"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(dir_.File("misaligned")), std::string::npos) << s.message();
  }
  EXPECT_EQ(backend_->InFlight(), 0u) << "a refused batch must queue nothing";
  // A batch with one bad request queues none of it.
  const IoRequest mixed[] = {{IoOp::kRead, f, 0, buf.data(), 4096, 1}, bad[0]};
  EXPECT_FALSE(backend_->Submit(mixed).ok());
  EXPECT_EQ(backend_->InFlight(), 0u);
}

TEST_P(IoBackendConformance, ReadPastEndOfFileIsAnErrorNotShortData) {
  const int f = Open("short", 8192);
  AlignedBuffer buf(16384);
  IoRequest r{IoOp::kRead, f, 4096, buf.data(), 8192, 7};  // 4096 bytes exist
  Status s = backend_->RunSync({&r, 1});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("end of file"), std::string::npos) << s.message();
  EXPECT_EQ(s.path(), dir_.File("short"));
}

TEST_P(IoBackendConformance, UnknownHandleAndCloseWithRequestsInFlight) {
  AlignedBuffer buf(4096);
  IoRequest r{IoOp::kRead, 12345, 0, buf.data(), 4096, 0};
  Status s = backend_->Submit({&r, 1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not open"), std::string::npos) << s.message();
  EXPECT_FALSE(backend_->CloseFile(12345).ok());

  const int f = Open("busy", 1 << 20);
  AlignedBuffer big(1 << 20);
  IoRequest w{IoOp::kWrite, f, 0, big.data(), 1 << 20, 1};
  ASSERT_TRUE(backend_->Submit({&w, 1}).ok());
  // Either the write is still in flight (close refused) or it finished already.
  Status c = backend_->CloseFile(f);
  if (!c.ok()) {
    EXPECT_NE(c.message().find("in flight"), std::string::npos) << c.message();
    IoCompletion out[1];
    ASSERT_TRUE(backend_->Poll(out, 1).ok());
    EXPECT_TRUE(out[0].status.ok());
    EXPECT_TRUE(backend_->CloseFile(f).ok());
  } else {
    IoCompletion out[1];
    Result<size_t> n = backend_->Poll(out, 1);
    ASSERT_TRUE(n.ok());
  }
}

TEST_P(IoBackendConformance, PollWithZeroMinimumDoesNotBlock) {
  IoCompletion out[4];
  Result<size_t> n = backend_->Poll(out, 0);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  n = backend_->Poll(out, 3);  // nothing in flight: returns at once
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
}

// Property test: random batches of reads and writes with random sizes, offsets and buffer
// alignments against an in-memory reference of the file. Requests in one batch never
// overlap (overlapping concurrent writes have no defined result on any backend).
TEST_P(IoBackendConformance, RandomBatchesMatchAnInMemoryReference) {
  const bool direct = GetParam().direct;
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr uint64_t kFile = 4 << 20;
  const int f = Open("prop", kFile);
  std::vector<char> ref(kFile, 0);  // fallocate'd space reads as zeros
  // Half the buffers live in a registered arena, half in plain heap memory.
  AlignedBuffer arena(kFile + 4096), heap(kFile + 4096);
  BufferRegion region{arena.data(), arena.size()};
  ASSERT_TRUE(backend_->RegisterBuffers({&region, 1}).ok());
  const uint64_t unit = direct ? kIoAlignment : 1;

  for (int batch = 0; batch < 30; ++batch) {
    const int n = std::uniform_int_distribution<int>(1, 20)(rng);
    std::vector<IoRequest> reqs;
    std::vector<std::pair<uint64_t, uint64_t>> used;  // [begin, end) in file and buffer
    uint64_t buf_cursor = 0;
    for (int i = 0; i < n; ++i) {
      for (int attempt = 0; attempt < 20; ++attempt) {
        uint64_t len = unit * std::uniform_int_distribution<uint64_t>(0, (256 << 10) / unit)(rng);
        if (rng() % 8 == 0) len = unit * std::uniform_int_distribution<uint64_t>(0, 3)(rng);
        const uint64_t off =
            unit * std::uniform_int_distribution<uint64_t>(0, (kFile - len) / unit)(rng);
        bool overlaps = false;
        for (auto [b, e] : used) overlaps |= off < e && b < off + len;
        if (overlaps) continue;
        const uint64_t misalign = direct ? 0 : rng() % 64;
        char* base = (rng() & 1) ? arena.data() : heap.data();
        uint64_t pos = (buf_cursor + misalign + unit - 1) / unit * unit;
        if (!direct) pos = buf_cursor + misalign;
        if (pos + len > kFile) break;
        buf_cursor = pos + len;
        used.push_back({off, off + len});
        IoRequest r{(rng() & 1) ? IoOp::kRead : IoOp::kWrite,
                    f,
                    off,
                    base + pos,
                    len,
                    uint64_t(reqs.size())};
        if (r.op == IoOp::kWrite)
          testing::FillPattern(r.buffer, len, rng());
        else
          std::memset(r.buffer, 0x5A, len);
        reqs.push_back(r);
        break;
      }
    }
    Status s = backend_->RunSync(reqs);
    ASSERT_TRUE(s.ok()) << "batch " << batch << ": " << s.ToString();
    for (const IoRequest& r : reqs) {
      if (r.op == IoOp::kRead) {
        ASSERT_EQ(std::memcmp(r.buffer, ref.data() + r.offset, r.length), 0)
            << "batch " << batch << " read of " << r.length << " at " << r.offset;
      } else {
        std::memcpy(ref.data() + r.offset, r.buffer, r.length);
      }
    }
  }
  // Finally the whole file, in one read.
  AlignedBuffer all(kFile);
  IoRequest r{IoOp::kRead, f, 0, all.data(), kFile, 0};
  ASSERT_TRUE(backend_->RunSync({&r, 1}).ok());
  EXPECT_EQ(std::memcmp(all.data(), ref.data(), kFile), 0);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, IoBackendConformance, ::testing::ValuesIn(AllConfigs()),
                         ConfigName);

}  // namespace
}  // namespace strata
