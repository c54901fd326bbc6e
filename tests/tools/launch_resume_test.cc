// The resume command a multi-rank run prints when interrupted under `strata launch` starts
// with the launch that started it (`strata launch -n 2 -- strata train ... --resume ...`),
// and runs as printed: before, it was rank 0's own command line, which as one rank cannot
// resume a store of two. A --run-secret given to the launch is never printed: the command
// leaves it out and says to give it again (one node: the launch makes a fresh one).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::Contains;

TEST(LaunchResume, InterruptedRunPrintsACommandThatStartsWithTheLaunch) {
  strata::testing::TempDir tmp("strata-launch-resume");
  std::filesystem::create_directories(tmp.File("n/0"));
  std::filesystem::create_directories(tmp.File("n/1"));
  std::vector<std::string> args = {STRATA_CLI_PATH,
                                   "launch",
                                   "-n",
                                   "2",
                                   "--run-secret",
                                   "s3cret-of-the-launch",
                                   "--",
                                   STRATA_CLI_PATH,
                                   "train",
                                   "--layers",
                                   "1",
                                   "--d-model",
                                   "32",
                                   "--heads",
                                   "1",
                                   "--seq-len",
                                   "16",
                                   "--batch",
                                   "2",
                                   "--steps",
                                   "200",
                                   "--lr",
                                   "1e-3",
                                   "--durable",
                                   "--log-every",
                                   "1",
                                   "--nvme",
                                   tmp.File("n/{rank}")};
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    ::close(p[0]);
    ::close(p[1]);
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "STRATA_RENDEZVOUS", "STRATA_LAUNCH_COMMAND"}) {
      ::unsetenv(v);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(STRATA_CLI_PATH, argv.data());
    ::_exit(127);
  }
  ::close(p[1]);
  std::string seen;
  char buf[512];
  ssize_t n;
  const std::string third = "[rank 0] step     3/200";
  while (!Contains(seen, third) && (n = ::read(p[0], buf, sizeof buf)) > 0) seen.append(buf, n);
  ASSERT_TRUE(Contains(seen, third)) << seen;
  ::kill(pid, SIGINT);
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) seen.append(buf, n);
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);

  EXPECT_FALSE(Contains(seen, "s3cret-of-the-launch")) << seen;
  EXPECT_TRUE(Contains(seen, "add the run secret again")) << seen;
  const std::string marker = "; resume with: ";
  const size_t at = seen.find(marker);
  ASSERT_NE(at, std::string::npos) << seen;
  const size_t from = at + marker.size();
  std::string resume = seen.substr(from, seen.find('\n', from) - from);
  resume = resume.substr(0, resume.find(" (add the run secret again"));
  const std::string launch = std::string(STRATA_CLI_PATH) + " launch -n 2 -- ";
  ASSERT_EQ(resume.rfind(launch, 0), 0u) << resume;
  EXPECT_TRUE(Contains(resume, "--resume '" + tmp.File("n/{rank}") + "'")) << resume;

  // As printed, through the shell: both ranks resume and finish the run.
  strata::testing::CliRunOptions o;
  o.timeout_s = 300;
  o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  const strata::testing::CliRun r =
      strata::testing::RunCli(resume.substr(std::string(STRATA_CLI_PATH).size() + 1), o);
  EXPECT_EQ(r.exit_code, 0) << resume << "\n" << r.output;
  EXPECT_TRUE(Contains(r.output, "[rank 0] # resumed at step")) << r.output;
  EXPECT_TRUE(Contains(r.output, "[rank 0] step   200/200")) << r.output;
}

}  // namespace
