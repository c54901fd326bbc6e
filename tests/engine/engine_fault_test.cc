// Engine faults on a HostDevice, injected below the swap store (strata/fault_injection.h):
// read and write errors surface as errors and a resume continues from the last commit,
// flipped bits are caught as corruption, and short transfers, EAGAIN and delays change no
// result. The fake model of fake_model.h makes every state depend on every byte moved.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/fault_injection.h"
#include "strata/log.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

// The tight NVMe run of `specs` in `dir` after steps 1..`steps`, committed and closed: its
// config, to resume from.
Result<RunConfig> Committed(const std::vector<BlockSpec>& specs, const std::string& dir,
                            int steps) {
  RunConfig rc = TightNvme(specs, dir);
  STRATA_ASSIGN_OR_RETURN(Fixture f, MakeEngine(specs, rc));
  STRATA_RETURN_IF_ERROR(RunSteps(f, 1, steps, 1, nullptr));
  return rc;
}

// `rc` resumed from its last commit, through `faults` when given.
RunConfig Resumed(RunConfig rc, const FaultInjectionOptions* faults = nullptr) {
  rc.resume = true;
  if (faults != nullptr) rc.io_factory = FaultInjectionFactory(*faults);
  return rc;
}

TEST(EngineFaultTest, ReadErrorSurfacesAndResumeContinuesFromLastCommit) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  auto ref = UnlimitedStates(specs, 4, 1, 0);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  TempDir dir;
  auto rc = Committed(specs, dir.path(), 2);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  {
    // Every NVMe request now fails with EIO: the error comes back as a status.
    FaultInjectionOptions fo;
    fo.eio = 1.0;
    auto f = MakeEngine(specs, Resumed(*rc, &fo));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->engine->ResumedStep(), 2);
    Status s = RunSteps(*f, 3, 3, 1, nullptr);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
    EXPECT_NE(s.message().find("reading block"), std::string::npos) << s.ToString();
    EXPECT_FALSE(f->engine->Error().ok());
    // The engine refuses further steps with the stored error.
    EXPECT_FALSE(f->engine->BeginStep(StepArgs{}).ok());
  }
  {
    auto f = MakeEngine(specs, Resumed(*rc));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ(f->engine->ResumedStep(), 2);
    Status s = RunSteps(*f, 3, 4, 1, nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto got = States(*f->engine);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(BitIdentical(*ref, *got));
  }
  SetLogSink(nullptr);
}

TEST(EngineFaultTest, WriteErrorLeavesLastCommitIntact) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  auto ref = UnlimitedStates(specs, 3, 1, 0);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  TempDir dir;
  auto rc = Committed(specs, dir.path(), 1);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  {
    FaultInjectionOptions fo;
    fo.seed = 7;
    fo.enospc = 0.5;  // writes fail with ENOSPC about half the time
    auto f = MakeEngine(specs, Resumed(*rc, &fo));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Status s = RunSteps(*f, 2, 3, 1, nullptr);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
  }
  auto f = MakeEngine(specs, Resumed(*rc));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->engine->ResumedStep(), 1);
  ASSERT_TRUE(RunSteps(*f, 2, 3, 1, nullptr).ok());
  auto got = States(*f->engine);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(BitIdentical(*ref, *got));
  SetLogSink(nullptr);
}

TEST(EngineFaultTest, FlippedBitsOnReadAreCaughtAsCorruption) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  TempDir dir;
  auto rc = Committed(specs, dir.path(), 1);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  FaultInjectionOptions fo;
  fo.flip_read = 1.0;
  auto f = MakeEngine(specs, Resumed(*rc, &fo));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Status s = RunSteps(*f, 2, 2, 1, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  SetLogSink(nullptr);
}

TEST(EngineFaultTest, ShortTransfersEagainAndDelaysAreInvisible) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  auto ref = UnlimitedStates(specs, 3, 2, 0);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  TempDir dir;
  RunConfig rc = TightNvme(specs, dir.path(), 2);
  FaultInjectionOptions fo;
  fo.seed = 3;
  fo.short_transfer = 0.3;
  fo.eagain = 0.3;
  fo.delay = 0.1;
  const IoBackend* backend = nullptr;  // the engine's, to read its counters
  rc.io_factory = [fo, &backend](const IoBackendOptions& io) -> Result<std::unique_ptr<IoBackend>> {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> b, FaultInjectionFactory(fo)(io));
    backend = b.get();
    return b;
  };
  auto f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Status s = RunSteps(*f, 1, 3, 2, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto got = States(*f->engine);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(BitIdentical(*ref, *got));
  // The faults happened (between steps the engine's I/O thread is idle).
  ASSERT_NE(backend, nullptr);
  const FaultCounters* injected = InjectedFaults(*backend);
  ASSERT_NE(injected, nullptr);
  EXPECT_GT(injected->short_transfers, 0u);
  EXPECT_GT(injected->eagain, 0u);
  EXPECT_GT(injected->delays, 0u);
  SetLogSink(nullptr);
}

}  // namespace
}  // namespace strata
