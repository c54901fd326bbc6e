// A run resumed on another number of ranks than wrote its store (issue 43): each rank reads
// its new shards from the old ranks' stores and commits them at the resumed step. 2 ranks
// resumed on 1, 3 and 4, and 4 on 2: the states loaded are the stored ones bit for bit (a
// resume that trains nothing saves the weights `strata export` reads from the old stores, and
// the re-sharded store exports the same weights and moments), and the losses continue the
// uninterrupted run within 1e-6 relative (the ranks' reductions sum in another grouping, as
// bar 6's N-vs-1 ranks). A kill at each point of the re-sharding commit leaves a store that
// resumes, on the new count or (before any rank finished it) the old one.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/io/io_test_util.h"
#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tests/trainer/rank_spawn.h"

namespace {

using strata::testing::ShellQuote;

const std::vector<std::string> kRankVars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                            "STRATA_RENDEZVOUS"};
constexpr int kSteps = 6, kStop = 3;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class TrainReshardTest : public ::testing::Test {
 protected:
  std::vector<std::string> Args(const std::string& store, int steps, bool resume,
                                const std::string& json) const {
    std::vector<std::string> a = {"train",
                                  "--layers",
                                  "2",
                                  "--d-model",
                                  "32",
                                  "--heads",
                                  "2",
                                  "--seq-len",
                                  "16",
                                  "--batch",
                                  "12",
                                  "--lr",
                                  "3e-3",
                                  "--host-mem",
                                  "600K",
                                  "--device-mem",
                                  "256K",
                                  "--comm-timeout",
                                  "10",
                                  "--threads",
                                  "1",
                                  "--steps",
                                  std::to_string(steps),
                                  "--nvme",
                                  store + "/{rank}",
                                  "--json",
                                  json};
    if (resume) a.insert(a.end(), {"--resume", store + "/{rank}"});
    a.insert(a.end(), extra_.begin(), extra_.end());
    return a;
  }
  // Runs `args` on `world` ranks; the --json document, or null (output in *out).
  nlohmann::json Run(int world, const std::vector<std::string>& args, const std::string& json,
                     std::string* out) {
    strata::testing::CliRunOptions o;
    o.timeout_s = 300;
    o.unset_env = kRankVars;
    const std::string cmd = world == 1 ? ShellQuote(args).substr(1)
                                       : "launch -n " + std::to_string(world) + " -- " +
                                             STRATA_CLI_PATH + ShellQuote(args);
    const auto r = strata::testing::RunCli(cmd, o);
    *out = r.output;
    if (r.exit_code != 0) return nullptr;
    std::ifstream f(json);
    return nlohmann::json::parse(f, nullptr, false);
  }
  std::vector<double> Losses(const nlohmann::json& j) {
    std::vector<double> l;
    for (const auto& s : j["steps"]) l.push_back(s["loss"].get<double>());
    return l;
  }
  // The uninterrupted run of `world` ranks; its losses.
  std::vector<double> Full(int world) {
    const std::string store = dir_ + "/full" + std::to_string(world);
    std::string out;
    const nlohmann::json j =
        Run(world, Args(store, kSteps, false, store + ".json"), store + ".json", &out);
    EXPECT_FALSE(j.is_null()) << out;
    return j.is_null() ? std::vector<double>{} : Losses(j);
  }
  // `from` ranks train kStop steps; their store resumed on `to` ranks must load the same
  // weights and continue as the uninterrupted run (`full`), within `tolerance` relative.
  void Reshard(int from, int to, const std::vector<double>& full, double tolerance = 1e-6) {
    const std::string what = std::to_string(from) + " -> " + std::to_string(to) + " ranks";
    const std::string store = dir_ + "/s" + std::to_string(from) + "to" + std::to_string(to);
    ASSERT_EQ(0, std::system(("mkdir -p " + store).c_str()));
    std::string out;
    ASSERT_FALSE(
        Run(from, Args(store, kStop, false, store + "/a.json"), store + "/a.json", &out).is_null())
        << what << "\n"
        << out;
    auto e = strata::testing::RunCli(
        "export" + ShellQuote({store + "/{rank}", "--out", store + "/before.safetensors",
                               "--with-optimizer"}));
    ASSERT_EQ(e.exit_code, 0) << e.output;
    // Loaded on `to` ranks, nothing trained: the weights saved are the stored ones.
    std::vector<std::string> load = Args(store, kStop, true, store + "/b.json");
    load.insert(load.end(), {"--save", store + "/loaded.safetensors"});
    const nlohmann::json b = Run(to, load, store + "/b.json", &out);
    ASSERT_FALSE(b.is_null()) << what << "\n" << out;
    ASSERT_TRUE(b["config"].contains("resharded")) << b["config"].dump();
    EXPECT_EQ(b["config"]["resharded"]["from_ranks"], from);
    EXPECT_EQ(b["config"]["resharded"]["to_ranks"], to);
    EXPECT_NE(out.find("# re-sharding: step 3 was written by " + std::to_string(from)),
              std::string::npos)
        << out;
    EXPECT_EQ(Slurp(store + "/loaded.safetensors"), Slurp(store + "/before.safetensors")) << what;
    // The re-sharded store, committed at the same step: weights and moments bit for bit.
    e = strata::testing::RunCli(
        "export" +
        ShellQuote({store + "/{rank}", "--out", store + "/after.safetensors", "--with-optimizer"}));
    ASSERT_EQ(e.exit_code, 0) << e.output;
    for (const char* part : {"", ".exp_avg", ".exp_avg_sq"}) {
      const std::string a = Slurp(store + "/after" + part + ".safetensors");
      EXPECT_FALSE(a.empty()) << what << part;
      EXPECT_TRUE(a == Slurp(store + "/before" + part + ".safetensors")) << what << part;
    }
    // Trained on (the store is the new count's now): the losses of the uninterrupted run.
    const nlohmann::json j =
        Run(to, Args(store, kSteps, true, store + "/c.json"), store + "/c.json", &out);
    ASSERT_FALSE(j.is_null()) << what << "\n" << out;
    EXPECT_FALSE(j["config"].contains("resharded")) << what << ": re-sharded again";
    const std::vector<double> got = Losses(j);
    ASSERT_EQ(got.size(), size_t(kSteps - kStop)) << what;
    for (int k = 0; k < kSteps - kStop; ++k) {
      const double ref = full[size_t(kStop + k)];
      EXPECT_LE(std::abs(got[size_t(k)] - ref), tolerance * std::abs(ref))
          << what << ", step " << kStop + k + 1 << ": " << got[size_t(k)] << " vs " << ref;
    }
    // The store is now the new count's: it verifies, and resumes on `to` without re-sharding.
    auto v = strata::testing::RunCli("verify" + ShellQuote({store + "/{rank}"}));
    EXPECT_EQ(v.exit_code, 0) << v.output;
  }

  // Rank by rank, rank r with `args[r]` (and `env[r]`); the rank `victim` (if any) is
  // SIGKILLed `after` from the start. Waits (bounded) for every rank; their wait statuses.
  std::vector<int> RunRanks(const std::vector<std::vector<std::string>>& args,
                            const std::vector<std::vector<std::string>>& env, int victim,
                            std::chrono::milliseconds after, const std::string& tag) {
    const int world = int(args.size());
    const std::string rdv = dir_ + "/rdv-" + tag;
    EXPECT_EQ(0, std::system(("mkdir -p " + rdv).c_str()));
    std::vector<pid_t> pids;
    std::vector<int> fds;
    for (int r = 0; r < world; ++r) {
      int fd = -1;
      pids.push_back(strata::testing::SpawnRank(r, world, rdv, args[size_t(r)], &fd,
                                                dir_ + "/err-" + tag + std::to_string(r),
                                                env[size_t(r)]));
      fds.push_back(fd);
    }
    const auto start = std::chrono::steady_clock::now();
    bool killed = victim < 0;
    int left = world;
    std::vector<int> status(size_t(world), -1);
    char buf[4096];
    while (left > 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
      if (!killed && std::chrono::steady_clock::now() - start >= after) {
        kill(pids[size_t(victim)], SIGKILL);
        killed = true;
      }
      for (int r = 0; r < world; ++r) {
        int st = 0;
        if (status[size_t(r)] == -1 && waitpid(pids[size_t(r)], &st, WNOHANG) == pids[size_t(r)]) {
          status[size_t(r)] = st;
          --left;
        }
        fcntl(fds[size_t(r)], F_SETFL, fcntl(fds[size_t(r)], F_GETFL) | O_NONBLOCK);
        while (read(fds[size_t(r)], buf, sizeof buf) > 0) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int r = 0; r < world; ++r) {
      if (status[size_t(r)] == -1) {
        kill(pids[size_t(r)], SIGKILL);
        waitpid(pids[size_t(r)], nullptr, 0);
        ADD_FAILURE() << tag << ": rank " << r << " hung";
      }
      close(fds[size_t(r)]);
    }
    return status;
  }
  // `args` on `world` ranks, `victim` with `env` (or SIGKILLed `after` from the start when
  // env is empty). Whether the victim died by that SIGKILL (a kill after the run ended, or
  // at a point the run never reaches, tests nothing); the wait status in *status.
  bool RunAndKill(int world, const std::vector<std::string>& args, int victim,
                  const std::vector<std::string>& env, std::chrono::milliseconds after,
                  const std::string& tag, int* status) {
    std::vector<std::vector<std::string>> envs(static_cast<size_t>(world));
    envs[size_t(victim)] = env;
    const std::vector<int> st = RunRanks(std::vector<std::vector<std::string>>(size_t(world), args),
                                         envs, env.empty() ? victim : -1, after, tag);
    *status = st[size_t(victim)];
    return *status != -1 && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL;
  }

  std::vector<std::string> extra_;  // flags every run of a test adds
  strata::testing::TempDir tmp_{"strata-reshard"};
  const std::string dir_ = tmp_.path();
};

TEST_F(TrainReshardTest, TwoRanksResumeOnOneThreeAndFour) {
  const std::vector<double> full = Full(2);
  ASSERT_EQ(full.size(), size_t(kSteps));
  for (const int to : {1, 3, 4}) {
    Reshard(2, to, full);
    if (HasFatalFailure()) return;
  }
}

// Two hosts with node-local folders: rank 1's host holds its own folder and no folder of
// rank 0's. Each rank resumes from its own record and store (rank 0's is read only by a rank
// that has none, one a re-sharding adds).
TEST_F(TrainReshardTest, EachRankResumesFromItsOwnFolder) {
  const std::string a = dir_ + "/hostA", b = dir_ + "/hostB";
  ASSERT_EQ(0, std::system(("mkdir -p " + a + " " + b).c_str()));
  std::string out;
  ASSERT_FALSE(Run(2, Args(a, kStop, false, a + "/a.json"), a + "/a.json", &out).is_null()) << out;
  ASSERT_EQ(0, std::rename((a + "/1").c_str(), (b + "/1").c_str()));
  const std::vector<int> st =
      RunRanks({Args(a, kSteps, true, a + "/r.json"), Args(b, kSteps, true, b + "/r.json")},
               {{}, {}}, -1, std::chrono::milliseconds(0), "hosts");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WIFEXITED(st[size_t(r)]) && WEXITSTATUS(st[size_t(r)]) == 0)
        << "rank " << r << ": " << Slurp(dir_ + "/err-hosts" + std::to_string(r));
  }
  std::ifstream f(a + "/r.json");
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(Losses(j).size(), size_t(kSteps - kStop));
}

// A store whose manifests name no rank count (killed before its first commit) cannot be
// re-sharded: a resume on another count is refused by the record's world size.
TEST_F(TrainReshardTest, AStoreWithoutARankCountResumesOnItsOwnCount) {
  const std::string store = dir_ + "/nocount";
  ASSERT_EQ(0, std::system(("mkdir -p " + store).c_str()));
  const std::vector<std::string> kill = {"STRATA_TEST_KILL_AT=commit_begin:1"};
  const std::vector<std::string> args = Args(store, kStop, false, store + "/a.json");
  RunRanks({args, args}, {kill, kill}, -1, std::chrono::milliseconds(0), "nocount");
  ASSERT_TRUE(std::ifstream(store + "/0/strata.run.toml").good());
  std::string out;
  EXPECT_TRUE(
      Run(1, Args(store, kSteps, true, store + "/r.json"), store + "/r.json", &out).is_null());
  EXPECT_NE(out.find("ranks (WORLD_SIZE): 2 -> 1"), std::string::npos) << out;
}

// A re-sharding resume cannot cut int8 moments, nor moments converted on the same resume:
// refused by name before anything is re-sharded (no "# re-sharding" line). With the stored
// format given again, --allow-state-dtype-change converts nothing and the re-sharding runs.
TEST_F(TrainReshardTest, Int8AndConvertingReshardsAreRefusedFirst) {
  struct Case {
    std::string stored;                    // --state-dtype of the 2-rank run
    std::vector<std::string> resume_with;  // added to the 3-rank resume
    std::string expect;                    // in the refusal; "" for none
  };
  const std::vector<Case> cases = {
      {"int8", {}, "its Adam moments are int8"},
      {"fp32", {"--state-dtype", "bf16", "--allow-state-dtype-change"}, "fp32 -> bf16"},
      {"fp32", {"--state-dtype", "fp32", "--allow-state-dtype-change"}, ""},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string store = dir_ + "/dt" + std::to_string(++n);
    ASSERT_EQ(0, std::system(("mkdir -p " + store).c_str()));
    std::vector<std::string> first = Args(store, kStop, false, store + "/a.json");
    first.insert(first.end(), {"--state-dtype", c.stored});
    std::string out;
    ASSERT_FALSE(Run(2, first, store + "/a.json", &out).is_null()) << out;
    std::vector<std::string> resume = Args(store, kSteps, true, store + "/r.json");
    resume.insert(resume.end(), c.resume_with.begin(), c.resume_with.end());
    out.clear();
    const nlohmann::json j = Run(3, resume, store + "/r.json", &out);
    if (c.expect.empty()) {
      ASSERT_FALSE(j.is_null()) << out;
      EXPECT_NE(out.find("# re-sharding"), std::string::npos) << out;
      EXPECT_EQ(out.find("converted"), std::string::npos) << out;
      EXPECT_EQ(Losses(j).size(), size_t(kSteps - kStop));
      continue;
    }
    EXPECT_TRUE(j.is_null()) << c.expect;
    EXPECT_NE(out.find(c.expect), std::string::npos) << out;
    EXPECT_NE(out.find("re-sharded onto 3"), std::string::npos) << out;
    EXPECT_EQ(out.find("# re-sharding"), std::string::npos) << "refused after it began:\n" << out;
  }
}

// A bf16 master (--master-dtype bf16) re-shards as an fp32 one, 2 bytes an element: 2 ranks
// resumed on 1 and 3 load the stored weights and moments bit for bit. Its stochastic rounding
// is keyed by the rank and indexed within the shard, so after the resume the rounding draws
// other bits than the 2-rank run's: the losses continue it closely (1e-3 relative), not within
// the 1e-6 of the fp32 runs.
TEST_F(TrainReshardTest, Bf16MasterTwoRanksResumeOnOneAndThree) {
  extra_ = {"--master-dtype", "bf16"};
  const std::vector<double> full = Full(2);
  ASSERT_EQ(full.size(), size_t(kSteps));
  for (const int to : {1, 3}) {
    Reshard(2, to, full, 1e-3);
    if (HasFatalFailure()) return;
  }
}

TEST_F(TrainReshardTest, FourRanksResumeOnTwo) {
  const std::vector<double> full = Full(4);
  ASSERT_EQ(full.size(), size_t(kSteps));
  Reshard(4, 2, full);
}

// A kill at each point of the re-sharding commit (2 -> 3 ranks), and at random
// moments: the next resume on 3 ranks (re-sharding again, or rolling the commit forward where a
// rank finished it) still continues the uninterrupted run; and where no rank finished the
// commit, the old 2-rank stores resume on 2 ranks as well.
TEST_F(TrainReshardTest, KilledDuringAReshardingResumeResumesAgain) {
  const std::vector<double> full = Full(2);
  ASSERT_EQ(full.size(), size_t(kSteps));
  std::mt19937 rng(static_cast<uint32_t>(strata::testing::TestSeed()));
  struct Kill {
    std::string point;  // STRATA_TEST_KILL_AT's, or "" for a random moment
    bool old_count_resumes;
  };
  const std::vector<Kill> kills = {
      {"commit_begin", true}, {"prepared", true}, {"committed", false}, {"", false}, {"", false}};
  int trial = 0;
  for (const Kill& k : kills) {
    const std::string tag = "k" + std::to_string(++trial);
    const std::string store = dir_ + "/" + tag;
    ASSERT_EQ(0, std::system(("mkdir -p " + store).c_str()));
    std::string out;
    ASSERT_FALSE(
        Run(2, Args(store, kStop, false, store + "/a.json"), store + "/a.json", &out).is_null())
        << out;
    const int victim = int(rng() % 3);
    auto after = std::chrono::milliseconds(200 + rng() % 1500);
    std::vector<std::string> args = Args(store, kSteps, true, store + "/{rank}.k.json");
    const std::vector<std::string> env =
        k.point.empty() ? std::vector<std::string>{}
                        : std::vector<std::string>{"STRATA_TEST_KILL_AT=" + k.point + ":1"};
    // A random moment that came after the run ended, or after the victim's last commit (the
    // resume then has nothing to train), is tried again sooner, on the store as it was (kept in
    // a copy).
    ASSERT_EQ(0, std::system(("cp -a " + store + " " + store + "-before").c_str()));
    auto sooner = [&] {
      after = std::max(std::chrono::milliseconds(10), after / 3);
      return std::system(("rm -rf " + store + " && cp -a " + store + "-before " + store).c_str());
    };
    std::string what;
    std::vector<double> got;
    for (int late = 0;; ++late) {
      int status = -1;
      for (int attempt = 0;
           !RunAndKill(3, args, victim, env, after,
                       tag + "a" + std::to_string(late) + std::to_string(attempt), &status) &&
           k.point.empty() && attempt < 6;
           ++attempt) {
        ASSERT_EQ(0, sooner());
      }
      what =
          (k.point.empty() ? "SIGKILL after " + std::to_string(after.count()) + " ms" : k.point) +
          " on rank " + std::to_string(victim) + " of 3";
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
          << what << ": the rank was not killed (wait status " << status << ")";
      if (k.old_count_resumes) {
        // Nothing finished: the store is still the 2 ranks' (a copy resumed there).
        const std::string copy = store + "-old";
        ASSERT_EQ(0, std::system(("cp -a " + store + " " + copy).c_str()));
        const nlohmann::json j =
            Run(2, Args(copy, kSteps, true, copy + "/o.json"), copy + "/o.json", &out);
        ASSERT_FALSE(j.is_null()) << what << "\n" << out;
        EXPECT_FALSE(j["config"].contains("resharded")) << what;
        const std::vector<double> old_run = Losses(j);
        ASSERT_EQ(old_run.size(), size_t(kSteps - kStop)) << what;
        for (size_t i = 0; i < old_run.size(); ++i) {
          EXPECT_EQ(old_run[i], full[full.size() - old_run.size() + i]) << what;
        }
      }
      const nlohmann::json j =
          Run(3, Args(store, kSteps, true, store + "/r.json"), store + "/r.json", &out);
      ASSERT_FALSE(j.is_null()) << what << ": the resume failed\n" << out;
      got = Losses(j);
      if (!got.empty() || !k.point.empty() || late == 3) break;
      ASSERT_EQ(0, sooner());
    }
    ASSERT_FALSE(got.empty()) << what << ": the resume trained nothing (the kill came too late)";
    for (size_t i = 0; i < got.size(); ++i) {
      const double ref = full[full.size() - got.size() + i];
      EXPECT_LE(std::abs(got[i] - ref), 1e-6 * std::abs(ref))
          << what << ": " << got[i] << " vs " << ref;
    }
  }
}

}  // namespace
