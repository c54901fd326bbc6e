// A rank killed at any moment of a multi-rank run never leaves the run unresumable: the
// ranks' stores commit together (engine/rank_commit.h), so `--resume` always finds a step
// every rank holds (rolling a prepared commit forward where a peer finished it) and
// reproduces the uninterrupted run's losses bit for bit. Trials with 2 and 3 ranks kill one
// rank at each point of the commit (STRATA_TEST_KILL_AT) and at random moments.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/io/io_test_util.h"
#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tests/trainer/rank_spawn.h"

namespace {

using namespace std::chrono_literals;
using strata::testing::ReadFile;
using strata::testing::ShellQuote;
using strata::testing::SpawnRank;

const std::vector<std::string> kRun = {
    "train", "--layers",     "2",    "--d-model",      "32", "--heads", "2",    "--seq-len",
    "16",    "--batch",      "6",    "--steps",        "16", "--lr",    "3e-3", "--host-mem",
    "600K",  "--device-mem", "256K", "--comm-timeout", "5"};

class TrainMultirankCrashTest : public ::testing::Test {
 protected:
  std::vector<std::string> Args(const std::string& store, bool resume,
                                const std::string& json) const {
    std::vector<std::string> a = kRun;
    a.insert(a.end(), {"--nvme", store + "/{rank}", "--json", json});
    if (resume) a.insert(a.end(), {"--resume", store + "/{rank}"});
    return a;
  }
  // The per-step losses of a run through `strata launch` (resumed: from its first step).
  nlohmann::json Launch(int world, const std::vector<std::string>& args, const std::string& json,
                        std::string* out) {
    strata::testing::CliRunOptions o;
    o.timeout_s = 300;
    const auto r = strata::testing::RunCli(
        "launch -n " + std::to_string(world) + " -- " + STRATA_CLI_PATH + ShellQuote(args), o);
    *out = r.output;
    if (r.exit_code != 0) return nullptr;
    std::ifstream f(json);
    return nlohmann::json::parse(f);
  }
  // Runs every rank directly, `victim` with `victim_env`, or killed `kill_after` after rank 0
  // printed its first step (the first commit is behind it) when that is positive; waits
  // (bounded) for all. Returns the ranks' stderr.
  std::string RunAndKill(int world, const std::vector<std::string>& args, int victim,
                         const std::vector<std::string>& victim_env,
                         std::chrono::milliseconds kill_after) {
    std::vector<pid_t> pids;
    std::vector<int> fds;
    for (int r = 0; r < world; ++r) {
      int fd = -1;
      pids.push_back(SpawnRank(r, world, dir_ + "/rdv" + std::to_string(trial_), args, &fd,
                               dir_ + "/err" + std::to_string(r),
                               r == victim ? victim_env : std::vector<std::string>{}));
      fds.push_back(fd);
    }
    const auto start = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> first_step;
    std::string rank0_out;
    bool killed = kill_after.count() <= 0;
    std::vector<bool> done(world, false);
    int left = world;
    char buf[4096];
    while (left > 0 && std::chrono::steady_clock::now() - start < 120s) {
      if (!killed && first_step && std::chrono::steady_clock::now() - *first_step >= kill_after) {
        kill(pids[victim], SIGKILL);
        killed = true;
      }
      for (int r = 0; r < world; ++r) {
        if (done[r]) continue;
        int st = 0;
        if (waitpid(pids[r], &st, WNOHANG) == pids[r]) done[r] = true, --left;
      }
      for (int r = 0; r < world; ++r) {
        const int flags = fcntl(fds[r], F_GETFL);
        fcntl(fds[r], F_SETFL, flags | O_NONBLOCK);
        ssize_t n;
        while ((n = read(fds[r], buf, sizeof buf)) > 0) {
          if (r == 0 && !first_step) {
            rank0_out.append(buf, size_t(n));
            if (rank0_out.find("step ") != std::string::npos) {
              first_step = std::chrono::steady_clock::now();
            }
          }
        }
      }
      std::this_thread::sleep_for(10ms);
    }
    std::string errs;
    for (int r = 0; r < world; ++r) {
      if (!done[r]) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        ADD_FAILURE() << "rank " << r << " hung after rank " << victim << " died";
      }
      close(fds[r]);
      errs += "rank " + std::to_string(r) + ": " + ReadFile(dir_ + "/err" + std::to_string(r));
    }
    return errs;
  }
  // One trial: the killed run, then --resume through launch, whose losses must be the
  // uninterrupted ones.
  void Trial(int world, const std::vector<double>& full, int victim,
             const std::vector<std::string>& victim_env, std::chrono::milliseconds kill_after,
             const std::string& what) {
    ++trial_;
    const std::string store = dir_ + "/t" + std::to_string(trial_);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(0, std::system(("mkdir -p " + store + "/" + std::to_string(r)).c_str()));
    }
    ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + "/rdv" + std::to_string(trial_)).c_str()));
    const std::string errs = RunAndKill(world, Args(store, false, store + "/killed.json"), victim,
                                        victim_env, kill_after);
    std::string out;
    const std::string json = store + "/resumed.json";
    const nlohmann::json j = Launch(world, Args(store, true, json), json, &out);
    ASSERT_FALSE(j.is_null()) << what << ": the resume failed\n"
                              << out << "\nthe killed run's errors:\n"
                              << errs;
    const int64_t from = j["config"]["resumed_step"];
    // A kill at a commit point always cuts the run short (commit n is of step n-1).
    if (!victim_env.empty()) {
      EXPECT_LT(from, 16) << what;
    }
    for (const auto& s : j["steps"]) {
      const int64_t k = s["step"];
      ASSERT_EQ(s["loss"].get<double>(), full[k - 1]) << what << ", resumed at " << from;
    }
    resumed_at_.push_back(from);
  }
  strata::testing::TempDir tmp_{"strata-mrc"};
  const std::string dir_ = tmp_.path();
  int trial_ = 0;
  std::vector<int64_t> resumed_at_;
};

TEST_F(TrainMultirankCrashTest, KillingARankAnywhereLeavesAResumableRun) {
  std::mt19937 rng(static_cast<uint32_t>(strata::testing::TestSeed()));
  for (const int world : {2, 3}) {
    std::string out;
    const std::string full_store = dir_ + "/full" + std::to_string(world);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(0, std::system(("mkdir -p " + full_store + "/" + std::to_string(r)).c_str()));
    }
    const std::string full_json = full_store + "/full.json";
    const nlohmann::json fj = Launch(world, Args(full_store, false, full_json), full_json, &out);
    ASSERT_FALSE(fj.is_null()) << out;
    std::vector<double> full;
    for (const auto& s : fj["steps"]) full.push_back(s["loss"].get<double>());
    ASSERT_EQ(full.size(), 16u);
    // The ranks pipeline their updates: the random-moment kills below land in the overlapped
    // region too (a kill at the N-th NVMe write cannot be aimed past the initial weights' writes
    // and before the run's end for both world sizes without counting them).
    ASSERT_NE(fj["placement"].dump().find("run under the next step's forward"), std::string::npos)
        << fj["placement"].dump();
    // Each point of a commit (commit n is of step n-1: the first commits the initial
    // weights), on a random rank at a random step; then random moments.
    for (const char* point : {"commit_begin", "data_synced", "prepared", "commit_finishing",
                              "manifest_renamed", "committed"}) {
      const int victim = int(rng() % world);
      const int n = 3 + int(rng() % 10);
      Trial(world, full, victim,
            {"STRATA_TEST_KILL_AT=" + std::string(point) + ":" + std::to_string(n)}, 0ms,
            std::string(point) + ":" + std::to_string(n) + " on rank " + std::to_string(victim) +
                " of " + std::to_string(world));
      if (HasFatalFailure()) return;
    }
    for (int t = 0; t < 3; ++t) {
      const int victim = int(rng() % world);
      const auto after = std::chrono::milliseconds(rng() % 800);
      Trial(world, full, victim, {}, after,
            "SIGKILL after " + std::to_string(after.count()) + " ms on rank " +
                std::to_string(victim) + " of " + std::to_string(world));
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
