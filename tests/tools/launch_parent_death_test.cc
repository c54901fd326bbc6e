// `strata launch` and its ranks' lives (issue 45, round 4): a launch killed by SIGKILL, which
// it cannot pass on, must take its ranks with it; and every launch gives its ranks a run
// secret (its own fresh one, or the one it is given).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

// Whether `pid` is a live process (a zombie is dead: its parent, possibly a PID 1 that does
// not reap, just has not collected it).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// "PID SECRET" as a rank wrote it to DIR/rank.R, or "" while it is not there.
std::string ReadRankFile(const std::string& dir, int r) {
  std::ifstream in(dir + "/rank." + std::to_string(r));
  std::string pid, secret;
  in >> pid >> secret;
  return secret.empty() ? "" : pid + " " + secret;
}

// Starts `strata launch -n 2 [extra] -- sh -c ...` whose ranks record their pid and
// STRATA_RUN_SECRET in `dir`, then sleep; returns launch's pid, once both ranks wrote.
pid_t StartSleepingRanks(const std::string& dir, const std::vector<std::string>& extra) {
  const std::string script = "echo $$ $STRATA_RUN_SECRET > " + dir + "/rank.$RANK.tmp && mv " +
                             dir + "/rank.$RANK.tmp " + dir + "/rank.$RANK && exec sleep 300";
  std::vector<std::string> args = {STRATA_CLI_PATH, "launch", "-n", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--", "sh", "-c", script});
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  for (int i = 0; i < 1000; ++i) {
    if (!ReadRankFile(dir, 0).empty() && !ReadRankFile(dir, 1).empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  return pid;
}

void KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(LaunchParentDeath, SigkillOfLaunchStopsItsRanks) {
  testing::TempDir dir("strata_launch_death");
  const pid_t launch = StartSleepingRanks(dir.path(), {});
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    const std::string line = ReadRankFile(dir.path(), r);
    ASSERT_FALSE(line.empty()) << "rank " << r << " never started";
    ranks.push_back(static_cast<pid_t>(std::stol(line)));
    ASSERT_TRUE(Alive(ranks.back()));
  }
  KillAndReap(launch);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while ((Alive(ranks[0]) || Alive(ranks[1])) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(Alive(ranks[r])) << "rank " << r << " (pid " << ranks[r]
                                  << ") outlived its launcher's SIGKILL";
    if (Alive(ranks[r])) ::kill(ranks[r], SIGKILL);
  }
}

TEST(LaunchParentDeath, EveryLaunchGivesItsRanksOneRunSecret) {
  std::vector<std::string> secrets;
  for (int run = 0; run < 2; ++run) {
    testing::TempDir dir("strata_launch_secret");
    ::unsetenv("STRATA_RUN_SECRET");
    const pid_t launch = StartSleepingRanks(dir.path(), {});
    std::istringstream r0(ReadRankFile(dir.path(), 0)), r1(ReadRankFile(dir.path(), 1));
    std::string p0, s0, p1, s1;
    r0 >> p0 >> s0;
    r1 >> p1 >> s1;
    ::kill(launch, SIGTERM);  // passed on to the ranks
    ::waitpid(launch, nullptr, 0);
    EXPECT_EQ(s0.size(), 64u) << s0;
    EXPECT_EQ(s0, s1) << "the ranks of one launch must share its secret";
    secrets.push_back(s0);
  }
  EXPECT_NE(secrets[0], secrets[1]) << "each launch makes a fresh secret";
  testing::TempDir dir("strata_launch_secret");
  const pid_t launch = StartSleepingRanks(dir.path(), {"--run-secret", "given-secret"});
  const std::string line = ReadRankFile(dir.path(), 1);
  ::kill(launch, SIGTERM);
  ::waitpid(launch, nullptr, 0);
  EXPECT_NE(line.find(" given-secret"), std::string::npos) << line;
}

// --run-secret-file: the secret stays out of ps; the ranks get the file's first line. A
// file other users may read is refused before any rank starts.
TEST(LaunchParentDeath, RunSecretFileGivesItsRanksTheSecretAndRefusesAReadableFile) {
  testing::TempDir dir("strata_launch_secret_file");
  const std::string file = dir.File("secret");
  { std::ofstream(file) << "from-a-file\n"; }
  ::chmod(file.c_str(), 0600);
  const pid_t launch = StartSleepingRanks(dir.path(), {"--run-secret-file", file});
  const std::string line = ReadRankFile(dir.path(), 0);
  ::kill(launch, SIGTERM);
  ::waitpid(launch, nullptr, 0);
  EXPECT_NE(line.find(" from-a-file"), std::string::npos) << line;
  ::chmod(file.c_str(), 0644);
  const std::string out = dir.File("out");
  const std::string cmd = std::string(STRATA_CLI_PATH) + " launch -n 2 --run-secret-file " + file +
                          " -- true > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(rc, 0) << text;
  EXPECT_NE(text.find("chmod 600 " + file), std::string::npos) << text;
}

}  // namespace
}  // namespace strata
