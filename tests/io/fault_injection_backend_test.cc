// FaultInjectionBackend over each real backend: every injected fault yields intact data or
// a non-OK status, never wrong bytes reported as OK — except the deliberate bit flips,
// which are reported OK (silent corruption) and must be caught by a checksum: this test
// computes its own per-block checksum and finds exactly the blocks the wrapper flipped.
#include "io/fault_injection_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "strata/io.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::Fnv1a;
using testing::TempDir;

constexpr uint64_t kBlock = 64 * 1024;
constexpr uint64_t kBlocks = 96;

class FaultInjection : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<IoBackend>> clean = MakeInner();
    if (!clean.ok() && clean.status().IsNotSupported()) {
      GTEST_SKIP() << clean.status().ToString();
    }
    ASSERT_TRUE(clean.ok()) << clean.status().ToString();
    clean_ = std::move(clean).value();
    Result<int> f = clean_->OpenFile(dir_.File("data"), {.create = true});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    clean_file_ = *f;
    ASSERT_TRUE(clean_->Allocate(clean_file_, kBlock * kBlocks).ok());
    src_ = std::make_unique<AlignedBuffer>(kBlock * kBlocks);
    dst_ = std::make_unique<AlignedBuffer>(kBlock * kBlocks);
    testing::FillPattern(src_->data(), src_->size(), 7);
    for (uint64_t i = 0; i < kBlocks; ++i) sums_.push_back(Fnv1a(Block(src_->data(), i), kBlock));
  }

  Result<std::unique_ptr<IoBackend>> MakeInner() {
    IoBackendOptions o;
    o.kind = GetParam();
    o.queue_depth = 16;
    return CreateIoBackend(o);
  }
  std::unique_ptr<FaultInjectionBackend> MakeFaulty(const FaultInjectionOptions& fo) {
    Result<std::unique_ptr<IoBackend>> inner = MakeInner();
    EXPECT_TRUE(inner.ok());
    return std::make_unique<FaultInjectionBackend>(std::move(inner).value(), fo);
  }
  static char* Block(char* base, uint64_t i) { return base + i * kBlock; }

  // Runs one request per block through `b`; returns each block's status.
  std::vector<Status> RunBlocks(IoBackend& b, int file, IoOp op, char* base) {
    std::vector<IoRequest> reqs;
    for (uint64_t i = 0; i < kBlocks; ++i) {
      reqs.push_back({op, file, i * kBlock, Block(base, i), kBlock, i});
    }
    std::vector<Status> st(kBlocks, Status::Aborted("no completion"));
    EXPECT_TRUE(b.Submit(reqs).ok());
    std::vector<IoCompletion> out(kBlocks);
    size_t got = 0;
    while (got < kBlocks) {
      Result<size_t> n = b.Poll(out, 1);
      EXPECT_TRUE(n.ok()) << n.status().ToString();
      if (!n.ok()) break;
      for (size_t i = 0; i < *n; ++i) st[out[i].user_data] = out[i].status;
      got += *n;
    }
    EXPECT_EQ(b.InFlight(), 0u);
    return st;
  }

  // Writes the pattern cleanly (no faults) so reads have something to check.
  void WriteClean() {
    for (const Status& s : RunBlocks(*clean_, clean_file_, IoOp::kWrite, src_->data())) {
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
  // Reads cleanly; returns the blocks whose checksum differs from the pattern's.
  std::vector<uint64_t> CorruptBlocksOnDisk() {
    std::memset(dst_->data(), 0, dst_->size());
    for (const Status& s : RunBlocks(*clean_, clean_file_, IoOp::kRead, dst_->data())) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    std::vector<uint64_t> bad;
    for (uint64_t i = 0; i < kBlocks; ++i) {
      if (Fnv1a(Block(dst_->data(), i), kBlock) != sums_[i]) bad.push_back(i);
    }
    return bad;
  }

  TempDir dir_;
  std::unique_ptr<IoBackend> clean_;
  int clean_file_ = -1;
  std::unique_ptr<AlignedBuffer> src_, dst_;
  std::vector<uint64_t> sums_;
};

// Reads through faults that must never surface as wrong bytes: each block is either OK
// and intact, or its status is an error.
void ExpectIntactOrError(const std::vector<Status>& st, char* data,
                         const std::vector<uint64_t>& sums, size_t* errors) {
  *errors = 0;
  for (uint64_t i = 0; i < st.size(); ++i) {
    if (st[i].ok()) {
      EXPECT_EQ(Fnv1a(data + i * kBlock, kBlock), sums[i])
          << "block " << i << " reported OK with wrong bytes";
    } else {
      ++*errors;
    }
  }
}

TEST_P(FaultInjection, ReadFaultsGiveIntactDataOrAnError) {
  WriteClean();
  FaultInjectionOptions fo;
  fo.seed = 11;
  fo.eio = 0.1;
  fo.short_transfer = 0.3;
  fo.eagain = 0.3;
  fo.delay = 0.05;
  fo.delay_us = 100;
  auto b = MakeFaulty(fo);
  Result<int> f = b->OpenFile(dir_.File("data"), {});
  ASSERT_TRUE(f.ok());
  std::vector<Status> st = RunBlocks(*b, *f, IoOp::kRead, dst_->data());
  size_t errors = 0;
  ExpectIntactOrError(st, dst_->data(), sums_, &errors);
  const FaultCounters& c = b->counters();
  EXPECT_GT(c.eio, 0u);
  EXPECT_GT(c.short_transfers, 0u);
  EXPECT_GT(c.eagain, 0u);
  EXPECT_GT(c.delays, 0u);
  EXPECT_EQ(errors, c.eio) << "every EIO, and only EIO, must surface as an error";
  for (const Status& s : st) {
    if (!s.ok()) {
      EXPECT_EQ(s.err_no(), EIO);
      EXPECT_NE(s.message().find("injected"), std::string::npos);
    }
  }
  EXPECT_EQ(b->Name(), "fault(" + std::string(clean_->Name()) + ")");
}

TEST_P(FaultInjection, WriteFaultsLeaveIntactBlocksOrAnError) {
  FaultInjectionOptions fo;
  fo.seed = 12;
  fo.eio = 0.1;
  fo.enospc = 0.1;
  fo.short_transfer = 0.3;
  fo.eagain = 0.3;
  auto b = MakeFaulty(fo);
  Result<int> f = b->OpenFile(dir_.File("data"), {});
  ASSERT_TRUE(f.ok());
  std::vector<Status> st = RunBlocks(*b, *f, IoOp::kWrite, src_->data());
  const FaultCounters& c = b->counters();
  EXPECT_GT(c.eio, 0u);
  EXPECT_GT(c.enospc, 0u);
  EXPECT_GT(c.short_transfers, 0u);
  size_t nospace = 0, failed = 0;
  for (const Status& s : st) {
    failed += !s.ok();
    nospace += s.IsNoSpace();
  }
  EXPECT_EQ(nospace, c.enospc);
  EXPECT_EQ(failed, c.eio + c.enospc);
  // Every write reported OK is on disk, byte for byte.
  std::vector<uint64_t> bad = CorruptBlocksOnDisk();
  for (uint64_t i : bad) EXPECT_FALSE(st[i].ok()) << "block " << i << " written OK but wrong";
}

TEST_P(FaultInjection, FlippedReadBitsAreReportedOkAndCaughtByAChecksum) {
  WriteClean();
  FaultInjectionOptions fo;
  fo.seed = 13;
  fo.flip_read = 0.2;
  fo.short_transfer = 0.2;
  auto b = MakeFaulty(fo);
  Result<int> f = b->OpenFile(dir_.File("data"), {});
  ASSERT_TRUE(f.ok());
  std::vector<Status> st = RunBlocks(*b, *f, IoOp::kRead, dst_->data());
  size_t mismatched = 0;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(st[i].ok()) << st[i].ToString();
    mismatched += Fnv1a(Block(dst_->data(), i), kBlock) != sums_[i];
  }
  EXPECT_GT(b->counters().flipped_reads, 0u);
  EXPECT_EQ(mismatched, b->counters().flipped_reads)
      << "each flipped read must be visible to the checksum";
  EXPECT_TRUE(CorruptBlocksOnDisk().empty()) << "a read flip must not reach the disk";
}

TEST_P(FaultInjection, FlippedWriteBitsReachTheDiskButNotTheCallersBuffer) {
  FaultInjectionOptions fo;
  fo.seed = 14;
  fo.flip_write = 0.2;
  auto b = MakeFaulty(fo);
  Result<int> f = b->OpenFile(dir_.File("data"), {});
  ASSERT_TRUE(f.ok());
  for (const Status& s : RunBlocks(*b, *f, IoOp::kWrite, src_->data())) ASSERT_TRUE(s.ok());
  for (uint64_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(Fnv1a(Block(src_->data(), i), kBlock), sums_[i]) << "caller's buffer changed";
  }
  EXPECT_GT(b->counters().flipped_writes, 0u);
  EXPECT_EQ(CorruptBlocksOnDisk().size(), b->counters().flipped_writes);
}

TEST_P(FaultInjection, SameSeedSameFaults) {
  WriteClean();
  FaultInjectionOptions fo;
  fo.seed = 99;
  fo.eio = 0.2;
  fo.short_transfer = 0.2;
  fo.eagain = 0.2;
  std::vector<bool> first;
  for (int run = 0; run < 2; ++run) {
    auto b = MakeFaulty(fo);
    Result<int> f = b->OpenFile(dir_.File("data"), {});
    ASSERT_TRUE(f.ok());
    std::vector<Status> st = RunBlocks(*b, *f, IoOp::kRead, dst_->data());
    std::vector<bool> ok;
    for (const Status& s : st) ok.push_back(s.ok());
    if (run == 0)
      first = ok;
    else
      EXPECT_EQ(ok, first);
  }
}

TEST_P(FaultInjection, AllocateCanFailWithNoSpace) {
  FaultInjectionOptions fo;
  fo.enospc = 1.0;
  auto b = MakeFaulty(fo);
  Result<int> f = b->OpenFile(dir_.File("data"), {});
  ASSERT_TRUE(f.ok());
  Status s = b->Allocate(*f, 1 << 20);
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_EQ(b->counters().enospc, 1u);
}

TEST_P(FaultInjection, BadRequestIsRefusedWithNothingQueued) {
  auto b = MakeFaulty(FaultInjectionOptions{.seed = 5, .eagain = 0.5});
  Result<int> f = b->OpenFile(dir_.File("data"), {});
  ASSERT_TRUE(f.ok());
  IoRequest bad{IoOp::kRead, *f, 1, dst_->data(), 4096, 0};  // misaligned on O_DIRECT
  const IoRequest reqs[] = {{IoOp::kRead, *f, 0, dst_->data(), 4096, 1}, bad};
  Status s = b->Submit(reqs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(b->InFlight(), 0u);
  EXPECT_EQ(b->counters().total(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultInjection,
                         ::testing::Values(IoBackendKind::kPosix, IoBackendKind::kUring),
                         [](const ::testing::TestParamInfo<IoBackendKind>& i) {
                           return std::string(IoBackendKindName(i.param));
                         });

}  // namespace
}  // namespace strata
