// `strata train` end to end: a run killed (SIGKILL) part-way and resumed with --resume gives
// exactly the losses of the uninterrupted run from the step after its last commit; --json
// has the documented fields; bad flags fail with a message naming the value.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

const std::vector<std::string> kModel = {
    "--layers",  "2",    "--d-model",    "32",   "--heads",    "2",
    "--seq-len", "16",   "--batch",      "2",    "--steps",    "30",
    "--lr",      "3e-3", "--device-mem", "128K", "--host-mem", "1M"};

class TrainCliTest : public ::testing::Test {
 protected:
  // Starts strata with `args`; returns its pid and a read end of its stdout.
  // With merge_stderr, standard error goes to the same pipe.
  pid_t Spawn(std::vector<std::string> args, int* out_fd, bool merge_stderr = false) {
    int p[2];
    EXPECT_EQ(0, pipe(p));
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      if (merge_stderr) dup2(p[1], 2);
      close(p[0]);
      close(p[1]);
      std::vector<char*> argv = {const_cast<char*>(STRATA_CLI_PATH)};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(STRATA_CLI_PATH, argv.data());
      _exit(127);
    }
    close(p[1]);
    *out_fd = p[0];
    return pid;
  }
  // Runs to completion; returns the exit code and appends stdout+stderr to *out.
  int Run(const std::vector<std::string>& args, std::string* out) {
    strata::testing::CliRunOptions options;
    options.timeout_s = 300;
    const strata::testing::CliRun r =
        strata::testing::RunCli(strata::testing::ShellQuote(args), options);
    *out += r.output;
    return r.exit_code;
  }
  std::vector<std::string> Args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"train"};
    a.insert(a.end(), kModel.begin(), kModel.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  nlohmann::json Json(const std::string& p) {
    std::ifstream f(p);
    return nlohmann::json::parse(f);
  }
  strata::testing::TempDir tmp_{"strata-cli"};
  const std::string dir_ = tmp_.path();
};

TEST_F(TrainCliTest, KilledRunResumesWithTheSameLosses) {
  ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + "/a " + dir_ + "/b").c_str()));
  std::string out;
  ASSERT_EQ(0, Run(Args({"--nvme", dir_ + "/a", "--json", dir_ + "/a.json"}), &out)) << out;
  const nlohmann::json full = Json(dir_ + "/a.json");
  ASSERT_EQ(full["steps"].size(), 30u);
  for (const char* k : {"step", "loss", "seconds", "tokens_per_s", "efficiency", "bytes"}) {
    EXPECT_TRUE(full["steps"][0].contains(k)) << k;
  }
  for (const char* k : {"nvme_read", "nvme_write", "h2d", "d2h"}) {
    EXPECT_TRUE(full["steps"][0]["bytes"].contains(k)) << k;
  }
  EXPECT_EQ(full["config"]["layers"], 2);

  // Kill the second run once it has printed step 3 (it may have committed more by then).
  int fd = -1;
  const pid_t pid = Spawn(Args({"--nvme", dir_ + "/b"}), &fd);
  std::string seen;
  char buf[512];
  ssize_t n;
  while (seen.find("step     3/30") == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0) {
    seen.append(buf, n);
  }
  ASSERT_NE(seen.find("step     3/30"), std::string::npos) << seen;
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  close(fd);

  out.clear();
  ASSERT_EQ(0, Run(Args({"--resume", dir_ + "/b", "--json", dir_ + "/c.json"}), &out)) << out;
  const nlohmann::json resumed = Json(dir_ + "/c.json");
  const int64_t from = resumed["config"]["resumed_step"];
  EXPECT_GE(from, 3);
  EXPECT_LT(from, 30) << "the kill came after the last step; nothing left to compare";
  ASSERT_EQ(resumed["steps"].size(), static_cast<size_t>(30 - from));
  for (const auto& s : resumed["steps"]) {
    const int64_t k = s["step"];
    EXPECT_EQ(s["loss"].get<double>(), full["steps"][k - 1]["loss"].get<double>()) << "step " << k;
  }
}

// Reads `fd` until `needle` appears (true) or the stream ends (false).
bool ReadUntil(int fd, const std::string& needle, std::string* seen) {
  char buf[512];
  ssize_t n;
  while (seen->find(needle) == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0) {
    seen->append(buf, n);
  }
  return seen->find(needle) != std::string::npos;
}

void ReadToEnd(int fd, std::string* seen) {
  char buf[512];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) seen->append(buf, n);
  close(fd);
}

// SIGINT part-way: the step in progress finishes, --json and --trace are valid JSON that say
// the run was interrupted, the exit code is 130, and the printed command resumes the run from
// the step it names, with the weights of --save-every written meanwhile.
TEST_F(TrainCliTest, InterruptedRunWritesItsOutputsAndSaysHowToResume) {
  int fd = -1;
  const pid_t pid =
      Spawn(Args({"--nvme", dir_ + "/n", "--json", dir_ + "/i.json", "--trace", dir_ + "/t.json",
                  "--save", dir_ + "/m.safetensors", "--save-every", "2"}),
            &fd, /*merge_stderr=*/true);
  std::string seen;
  ASSERT_TRUE(ReadUntil(fd, "step     3/30", &seen)) << seen;
  kill(pid, SIGINT);
  ReadToEnd(fd, &seen);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << seen;
  EXPECT_EQ(WEXITSTATUS(st), 130) << seen;

  const nlohmann::json js = Json(dir_ + "/i.json");
  EXPECT_TRUE(js["totals"]["interrupted"].get<bool>());
  EXPECT_EQ(js["totals"]["signal"], "SIGINT");
  const int64_t last = js["totals"]["last_step"];
  EXPECT_GE(last, 3);
  EXPECT_LT(last, 30) << "the signal came after the last step";
  EXPECT_EQ(js["steps"].size(), static_cast<size_t>(last));
  EXPECT_NO_THROW(Json(dir_ + "/t.json")) << "the trace is cut";
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/m.safetensors"));

  const std::string marker = "interrupted (SIGINT) at step " + std::to_string(last) +
                             "; resume with: " + STRATA_CLI_PATH + " ";
  const size_t at = seen.find(marker);
  ASSERT_NE(at, std::string::npos) << seen;
  const size_t from = at + marker.size();
  std::string resume = seen.substr(from, seen.find('\n', from) - from);
  EXPECT_NE(resume.find("--resume " + dir_ + "/n"), std::string::npos) << resume;

  // The printed command, as printed, continues from the step after the interrupted one.
  strata::testing::CliRunOptions options;
  options.timeout_s = 300;
  const strata::testing::CliRun r = strata::testing::RunCli(resume, options);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json resumed = Json(dir_ + "/i.json");
  EXPECT_EQ(resumed["config"]["resumed_step"], last);
  EXPECT_EQ(resumed["totals"]["first_step"], last + 1);
  EXPECT_EQ(resumed["totals"]["last_step"], 30);
  EXPECT_FALSE(resumed["totals"]["interrupted"].get<bool>());
  EXPECT_NE(r.output.find("step " + std::to_string(last + 1) +
                          " (the first after resuming at step " + std::to_string(last) + ")"),
            std::string::npos)
      << r.output;
}

// SIGTERM: exit code 143; without --nvme the run says it cannot be resumed. A second signal
// aborts at once (the default action).
TEST_F(TrainCliTest, SigtermAndASecondSignal) {
  int fd = -1;
  pid_t pid = Spawn(Args({}), &fd, true);
  std::string seen;
  ASSERT_TRUE(ReadUntil(fd, "step     2/30", &seen)) << seen;
  kill(pid, SIGTERM);
  ReadToEnd(fd, &seen);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << seen;
  EXPECT_EQ(WEXITSTATUS(st), 143) << seen;
  EXPECT_NE(seen.find("interrupted (SIGTERM) at step"), std::string::npos) << seen;
  EXPECT_NE(seen.find("cannot be resumed"), std::string::npos) << seen;

  // A model whose steps take long enough that both signals land inside one step.
  seen.clear();
  pid = Spawn({"train", "--layers", "4", "--d-model", "256", "--heads", "4", "--seq-len", "128",
               "--batch", "8", "--steps", "40"},
              &fd, true);
  ASSERT_TRUE(ReadUntil(fd, "step     1/40", &seen)) << seen;
  kill(pid, SIGINT);
  usleep(20000);
  kill(pid, SIGINT);
  ReadToEnd(fd, &seen);
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << seen;
  EXPECT_EQ(WTERMSIG(st), SIGINT);
}

// The configuration is printed before the engine is made, then each start-up phase; step
// lines come every --log-every steps when standard output is not a terminal (by default at
// most 50); --trace-steps limits the trace, which names its process.
TEST_F(TrainCliTest, StartupLogEveryAndTraceSteps) {
  const std::vector<std::string> tiny = {"train",   "--layers", "1",         "--d-model", "32",
                                         "--heads", "2",        "--seq-len", "16",        "--batch",
                                         "2",       "--steps",  "120"};
  auto lines = [](const std::string& out) {
    int n = 0;
    for (size_t p = 0; (p = out.find("\nstep ", p)) != std::string::npos; ++p) ++n;
    return n;
  };
  std::vector<std::string> args = tiny;
  args.insert(args.end(), {"--trace", dir_ + "/t.json", "--trace-steps", "5:6"});
  std::string out;
  ASSERT_EQ(0, Run(args, &out)) << out;
  EXPECT_EQ(lines(out), 25) << out;  // steps 1, 5, 10, ..., 120
  const size_t config = out.find("# strata train: GPT-2");
  const size_t placing = out.find("# placing the states and creating the engine ... done");
  const size_t init = out.find("# initialising the weights (seed 1) ... done");
  const size_t placement = out.find("# placement:");
  ASSERT_NE(placement, std::string::npos) << out;
  EXPECT_LT(config, placing) << out;
  EXPECT_LT(placing, init) << out;
  EXPECT_LT(init, placement) << out;
  const nlohmann::json trace = Json(dir_ + "/t.json");
  std::set<std::string> steps;
  for (const auto& e : trace["traceEvents"]) {
    const std::string name = e["name"];
    if (name.rfind("step ", 0) == 0) steps.insert(name);
    if (name == "process_name") {
      EXPECT_EQ(e["args"]["name"], "strata");
    }
  }
  EXPECT_EQ(steps, (std::set<std::string>{"step 5", "step 6"}));

  args = tiny;
  args.insert(args.end(), {"--log-every", "40"});
  out.clear();
  ASSERT_EQ(0, Run(args, &out)) << out;
  EXPECT_EQ(lines(out), 4) << out;  // 1, 40, 80, 120

  args = tiny;
  args.insert(args.end(), {"--trace", dir_ + "/t.json", "--trace-steps", "6:5"});
  out.clear();
  EXPECT_NE(0, Run(args, &out));
  EXPECT_NE(out.find("--trace-steps 6:5: expected a:b"), std::string::npos) << out;
}

// Under the usual 8 MiB RLIMIT_MEMLOCK a CPU run says nothing about locking its host memory
// (nothing is gained by it there).
TEST_F(TrainCliTest, NoMemlockWarningOnTheHostDevice) {
  const std::string cmd = std::string("ulimit -l 8192 && ") + STRATA_CLI_PATH +
                          " train --device cpu --layers 2 --d-model 256 --heads 4 --seq-len 16 "
                          "--batch 2 --steps 1 2>&1";
  FILE* p = popen(("sh -c '" + cmd + "'").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("model + optimizer states: 2"), std::string::npos) << out;  // > 8 MiB
  EXPECT_EQ(out.find("RLIMIT_MEMLOCK"), std::string::npos) << out;
}

TEST_F(TrainCliTest, BadFlagsNameTheValue) {
  std::string out;
  EXPECT_NE(0, Run({"train", "--d-model", "30", "--heads", "4", "--steps", "1"}, &out));
  EXPECT_NE(out.find("--d-model 30 must be a multiple of --heads 4"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(0, Run({"train", "--lr-schedule", "linear", "--steps", "1"}, &out));
  EXPECT_NE(out.find("--lr-schedule linear"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(0, Run({"train", "--device-mem", "lots", "--steps", "1"}, &out));
  EXPECT_NE(out.find("--device-mem lots"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(0, Run({"train", "--init", dir_ + "/missing.safetensors"}, &out));
  EXPECT_NE(out.find("missing.safetensors"), std::string::npos) << out;
}

TEST_F(TrainCliTest, ConfigFileSaveAndGenerate) {
  {
    std::ofstream f(dir_ + "/run.toml");
    f << "layers = 1\nd-model = 32\nheads = 2\nseq-len = 16\nbatch = 2\nsteps = 3\n";
  }
  std::string out;
  ASSERT_EQ(0, Run({"train", "--config", dir_ + "/run.toml", "--save", dir_ + "/m.safetensors",
                    "--json", dir_ + "/r.json"},
                   &out))
      << out;
  const nlohmann::json r = Json(dir_ + "/r.json");
  EXPECT_EQ(r["config"]["layers"], 1);
  EXPECT_EQ(r["config"]["d_model"], 32);
  EXPECT_EQ(r["steps"].size(), 3u);
  out.clear();
  ASSERT_EQ(0, Run({"generate", "--init", dir_ + "/m.safetensors", "--heads", "2", "--prompt",
                    "The ", "--tokens", "10"},
                   &out))
      << out;
  EXPECT_EQ(out.rfind("The ", 0), 0u) << out;
  EXPECT_GE(out.size(), 14u);
}

}  // namespace
