// SwapStore over several folders (issue 45, round 4): every folder carries the store's
// identity and its place in the stripe (io/stripe_marker.h). A fresh store over any folder of
// another store's committed state is refused naming the store's run and step, before anything
// is made there; a reopen that gives the folders in another order, or only some of them,
// names the misplaced and missing folders and never suggests a fresh start; a store that
// committed nothing past SwapStoreOptions::replace_through_step is taken as new.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "io/stripe_marker.h"
#include "io/swap_store.h"
#include "io_test_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

SwapStoreOptions Options(const std::vector<std::string>& paths, const std::string& run,
                         bool create = true) {
  SwapStoreOptions o;
  o.paths = paths;
  o.capacity_bytes = create ? kMiB : 0;
  o.stripe_bytes = 4096;
  o.create = create;
  o.run_id = run;
  o.backend.kind = IoBackendKind::kPosix;
  o.backend.queue_depth = 4;
  return o;
}

bool Contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// The names and sizes of a folder's files, to show that a refused open changed nothing.
std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.insert(e.path().filename().string() + ":" + std::to_string(e.file_size()));
  }
  return out;
}

class SwapStoreStripeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directory(a_);
    std::filesystem::create_directory(b_);
  }
  // A store over {a, b} of run "r1" with one extent committed at `step`.
  void Commit(uint64_t step) {
    auto store = SwapStore::Open(Options({a_, b_}, "r1"));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    AlignedBuffer buf(3 * 4096);
    std::memset(buf.data(), 5, 3 * 4096);
    ASSERT_TRUE((*store)->Write("k", buf.data(), 3 * 4096).ok());
    ASSERT_TRUE((*store)->Commit(step).ok());
  }
  TempDir tmp_{"strata-stripe"};
  const std::string a_ = tmp_.File("a"), b_ = tmp_.File("b");
};

TEST_F(SwapStoreStripeTest, EveryFolderCarriesTheStoreAndItsPlace) {
  Commit(1);
  auto ma = swap_internal::ReadStripeMarker(a_);
  auto mb = swap_internal::ReadStripeMarker(b_);
  ASSERT_TRUE(ma.ok() && mb.ok());
  ASSERT_TRUE(ma->has_value() && mb->has_value());
  EXPECT_EQ((*ma)->store_id, (*mb)->store_id);
  EXPECT_EQ((*ma)->index, 0u);
  EXPECT_EQ((*mb)->index, 1u);
  EXPECT_EQ((*mb)->count, 2u);
  EXPECT_EQ((*mb)->run_id, "r1");
  ASSERT_EQ((*mb)->folders.size(), 2u);
  EXPECT_EQ((*mb)->folders[0], std::filesystem::canonical(a_).string());
  // A marker round-trips, and a damaged one is Corruption naming it.
  const std::string bytes = swap_internal::EncodeStripeMarker(**mb);
  auto back = swap_internal::DecodeStripeMarker(bytes, "m");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->folders, (*mb)->folders);
  // A store made without a run identity (the engine tests', the Python layer's) too.
  swap_internal::StripeMarker anonymous = **mb;
  anonymous.run_id.clear();
  auto plain = swap_internal::DecodeStripeMarker(swap_internal::EncodeStripeMarker(anonymous), "m");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->run_id, "");
  std::string bad = bytes;
  bad[bad.size() / 2] ^= 1;
  auto refused = swap_internal::DecodeStripeMarker(bad, "x/strata.stripe");
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(refused.status().message(), "x/strata.stripe"));
}

// Before: a fresh store in b alone, or in b then a, took b as empty (a has the manifest),
// and a could no longer be resumed.
TEST_F(SwapStoreStripeTest, AFreshStoreRefusesAnyFolderOfACommittedStore) {
  Commit(4);
  const auto before_a = Listing(a_), before_b = Listing(b_);
  for (const std::vector<std::string>& paths :
       {std::vector<std::string>{b_}, {b_, a_}, {a_}, {tmp_.File("c"), b_}}) {
    std::filesystem::create_directory(tmp_.File("c"));
    auto s = SwapStore::Open(Options(paths, "r2"));
    ASSERT_FALSE(s.ok()) << paths[0];
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    const std::string msg = s.status().message();
    EXPECT_TRUE(Contains(msg, "run 'r1'")) << msg;
    EXPECT_TRUE(Contains(msg, "committed at step 4")) << msg;
    EXPECT_TRUE(Contains(msg, "of 2 of the swap store")) << msg;
    EXPECT_EQ(Listing(a_), before_a);
    EXPECT_EQ(Listing(b_), before_b);
  }
  // The store itself is intact.
  auto reopened = SwapStore::Open(Options({a_, b_}, "r1", /*create=*/false));
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ((*reopened)->CommittedStep(), std::optional<uint64_t>(4));
}

// Before: "no swap store in b ... start a fresh run there (without --resume)".
TEST_F(SwapStoreStripeTest, AReopenInAnotherOrderOrInPartNamesTheFolders) {
  Commit(2);
  const auto before_a = Listing(a_), before_b = Listing(b_);
  struct Case {
    std::vector<std::string> paths;
    std::vector<std::string> says;
  };
  const std::string a = std::filesystem::canonical(a_).string();
  const std::string b = std::filesystem::canonical(b_).string();
  for (const Case& c : std::vector<Case>{
           {{b_, a_},
            {b_ + " (given as folder 0) is the store's folder 1 of 2",
             a_ + " (given as folder 1) is the store's folder 0 of 2",
             "--nvme " + a_ + " --nvme " + b_}},
           {{b_}, {"is the store's folder 1 of 2", "its folder 0 is not given", a}},
           {{a_}, {"its folder 1 is not given (it was " + b + " when the store was made)"}}}) {
    auto s = SwapStore::Open(Options(c.paths, "r1", /*create=*/false));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    const std::string msg = s.status().message();
    for (const std::string& w : c.says) EXPECT_TRUE(Contains(msg, w)) << w << "\n" << msg;
    EXPECT_FALSE(Contains(msg, "fresh")) << msg;
    EXPECT_EQ(Listing(a_), before_a);
    EXPECT_EQ(Listing(b_), before_b);
  }
}

// The engine's initial commit is step 0: a run that stopped there trained nothing, and a
// fresh run (replace_through_step 0) takes its store. Without it the store is kept.
TEST_F(SwapStoreStripeTest, AStoreThatCommittedOnlyStepZeroIsTakenByAFreshRun) {
  Commit(0);
  {
    auto kept = SwapStore::Open(Options({a_, b_}, "r2"));
    ASSERT_TRUE(kept.ok()) << kept.status().ToString();
    EXPECT_EQ((*kept)->CommittedStep(), std::optional<uint64_t>(0));
    EXPECT_EQ((*kept)->RunId(), "r1");
  }
  for (const std::vector<std::string>& paths : {std::vector<std::string>{b_}, {a_, b_}}) {
    SwapStoreOptions o = Options(paths, "r2");
    o.replace_through_step = 0;
    auto fresh = SwapStore::Open(o);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    EXPECT_FALSE((*fresh)->CommittedStep().has_value());
    EXPECT_EQ((*fresh)->RunId(), "r2");
    EXPECT_FALSE((*fresh)->Lookup("k").has_value());
  }
}

}  // namespace
}  // namespace strata
