// `strata train` end to end: a run killed (SIGKILL) part-way and resumed with --resume alone
// gives exactly the losses of the uninterrupted run from the step after its last commit; a
// resume that would train another run is refused, listing each difference; --json has the
// documented fields; bad flags fail with a message naming the value; --save records the
// geometry that generate, eval and train --init then need no flags for; --config files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
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
  for (const char* k :
       {"step", "loss", "seconds", "tokens_per_s", "efficiency", "bytes", "stall_seconds",
        "tail_seconds", "redone_blocks", "model_tflops_per_s", "compute_seconds"}) {
    EXPECT_TRUE(full["steps"][0].contains(k)) << k;
  }
  // Model TFLOP/s = Gpt2TrainFlopsPerToken x tokens / seconds: 6 x params + the attention's
  // 12·L·T·C per token, 2 layers of 32 channels, T 16, batch 2.
  {
    const double per_token = 6.0 * full["config"]["params"].get<double>() + 12.0 * 2 * 16 * 32;
    const double tokens = 2.0 * 16;
    for (const auto& st : full["steps"]) {
      EXPECT_NEAR(st["model_tflops_per_s"].get<double>(),
                  per_token * tokens / st["seconds"].get<double>() / 1e12, 1e-9);
      EXPECT_EQ(st["compute_seconds"].get<double>(), 0.0);  // the CPU model: the engine's lane
    }
    EXPECT_DOUBLE_EQ(full["totals"]["model_flops"].get<double>(), per_token * tokens * 30);
  }
  EXPECT_NE(out.find("TFLOP/s"), std::string::npos) << out;
  for (const char* k : {"nvme_read", "nvme_write", "h2d", "d2h"}) {
    EXPECT_TRUE(full["steps"][0]["bytes"].contains(k)) << k;
  }
  EXPECT_EQ(full["config"]["layers"], 2);
  // Where the time went: per step and in the totals, in the line and the table too.
  double tail = 0;
  for (const auto& st : full["steps"]) {
    EXPECT_GT(st["tail_seconds"].get<double>(), 0.0);
    EXPECT_LT(st["tail_seconds"].get<double>() + st["stall_seconds"].get<double>(),
              st["seconds"].get<double>());
    // Redone only when the step updated speculatively and then clipped.
    EXPECT_GE(st["redone_blocks"].get<int64_t>(), 0);
    if (!st["speculative"].get<bool>()) {
      EXPECT_EQ(st["redone_blocks"], 0);
    }
    tail += st["tail_seconds"].get<double>();
  }
  EXPECT_NEAR(full["totals"]["tail_seconds"].get<double>(), tail, 1e-9);
  EXPECT_NE(out.find("%  ETA"), std::string::npos) << out;
  EXPECT_NE(out.find(" tail "), std::string::npos) << out;
  EXPECT_NE(out.find("#step_time"), std::string::npos) << out;
  // The disk footprint is the swap file's size.
  const uint64_t file = std::filesystem::file_size(dir_ + "/a/strata.swap.0-of-1");
  EXPECT_EQ(full["placement"]["nvme_file_bytes"].get<uint64_t>(), file);
  EXPECT_GT(file, 2 * full["placement"]["nvme_bytes"].get<uint64_t>());

  // Kill the second run once it has printed step 3 (it may have committed more by then).
  int fd = -1;
  const pid_t pid = Spawn(Args({"--nvme", dir_ + "/b", "--json", dir_ + "/c.json"}), &fd);
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

  // --resume alone: every setting (--json included) comes from the store's record.
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", dir_ + "/b"}, &out)) << out;
  const nlohmann::json resumed = Json(dir_ + "/c.json");
  const int64_t from = resumed["config"]["resumed_step"];
  // Step 3's updates run under step 4's forward and it commits there (--pipeline on, the
  // default): the kill may find step 2 as the last commit.
  EXPECT_GE(from, 2);
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

// A warning while a start-up phase's "# ... ..." line is open (here: --nvme on tmpfs, which
// has no O_DIRECT) starts a line of its own, and the phase ends on its own line after it.
TEST_F(TrainCliTest, AStartupWarningStartsALineOfItsOwn) {
  const std::string shm = "/dev/shm/strata_train_cli_test_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(shm.c_str(), 0755), 0);
  const std::string cmd = std::string(STRATA_CLI_PATH) +
                          " train --device cpu --layers 1 --d-model 32 --heads 2 --seq-len 16 "
                          "--batch 2 --steps 1 --host-mem 1M --nvme " +
                          shm + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  std::filesystem::remove_all(shm);
  ASSERT_EQ(rc, 0) << out;
  const std::string phase = "# placing the states and creating the engine";
  EXPECT_NE(out.find(phase + " ...\nstrata: warning: "), std::string::npos) << out;
  const size_t warning = out.find("tmpfs");
  const size_t done = out.find("\n" + phase + ": done (");
  ASSERT_NE(warning, std::string::npos) << out;
  EXPECT_LT(warning, done) << out;
  EXPECT_NE(done, std::string::npos) << out;
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
  EXPECT_NE(0, Run({"train", "--state-dtype", "fp8", "--steps", "1"}, &out));
  EXPECT_NE(out.find("--state-dtype fp8: expected fp32, bf16, bf16-rne or int8"), std::string::npos)
      << out;
  out.clear();
  EXPECT_NE(0, Run({"train", "--master-dtype", "fp16", "--steps", "1"}, &out));
  EXPECT_NE(out.find("--master-dtype fp16: expected fp32 or bf16"), std::string::npos) << out;
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

// The flags that define the run are refused on --resume when they differ from the stored run,
// all in one message with the stored and the given value; the store is left as it was.
TEST_F(TrainCliTest, ResumeRefusesAnotherRun) {
  ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + "/s").c_str()));
  {
    std::ofstream(dir_ + "/d.txt") << std::string(4000, 'a') + "the quick brown fox\n";
    std::ofstream(dir_ + "/e.txt") << std::string(4000, 'b') + "jumps over the lazy dog\n";
  }
  std::string out;
  ASSERT_EQ(0,
            Run({"train", "--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "16",
                 "--batch", "2", "--steps", "3", "--data", dir_ + "/d.txt", "--nvme", dir_ + "/s"},
                &out))
      << out;
  const std::string resume = dir_ + "/s";
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--heads", "4"}, "--heads: 2 -> 4"},  // same tensor shapes, another model
      {{"--data", dir_ + "/e.txt"}, "--data: \"" + dir_ + "/d.txt\" -> \"" + dir_ + "/e.txt\""},
      {{"--batch", "4"}, "--batch: 2 -> 4"},
      {{"--lr", "0.01"}, "--lr: 0.001 -> 0.01"},
      {{"--beta2", "0.9"}, "--beta2: 0.95 -> 0.9"},
      {{"--state-dtype", "bf16"}, "--state-dtype: \"fp32\" -> \"bf16\""},
      {{"--state-dtype", "int8"}, "--state-dtype: \"fp32\" -> \"int8\""},
      {{"--grad-dtype", "bf16"}, "--grad-dtype: \"fp32\" -> \"bf16\""},
      {{"--master-dtype", "bf16"}, "--master-dtype: \"fp32\" -> \"bf16\""},
  };
  for (const auto& [flags, line] : refused) {
    std::vector<std::string> args = {"train", "--resume", resume, "--steps", "5"};
    args.insert(args.end(), flags.begin(), flags.end());
    out.clear();
    EXPECT_EQ(1, Run(args, &out)) << out;
    EXPECT_NE(out.find("started with other settings"), std::string::npos) << out;
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
    EXPECT_EQ(out.find("step "), std::string::npos) << "no step may run: " << out;
  }
  // A folder that does not exist is named, not a crash.
  out.clear();
  EXPECT_EQ(1, Run({"train", "--resume", dir_ + "/nosuch"}, &out));
  EXPECT_NE(out.find(dir_ + "/nosuch"), std::string::npos) << out;
  // Every difference in one message.
  out.clear();
  EXPECT_EQ(1, Run({"train", "--resume", resume, "--heads", "4", "--batch", "4", "--beta2", "0.9"},
                   &out));
  for (const char* line : {"--heads: 2 -> 4", "--batch: 2 -> 4", "--beta2: 0.95 -> 0.9"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  // Same flags, another file content under the same name.
  std::ofstream(dir_ + "/d.txt", std::ios::app) << "one more line\n";
  out.clear();
  EXPECT_EQ(1, Run({"train", "--resume", resume}, &out));
  EXPECT_NE(out.find("the file changed since the run started"), std::string::npos) << out;
  { std::ofstream(dir_ + "/d.txt") << std::string(4000, 'a') + "the quick brown fox\n"; }
  // The same data at another path is the same run.
  ASSERT_EQ(0, std::system(("cp " + dir_ + "/d.txt " + dir_ + "/moved.txt").c_str()));
  out.clear();
  EXPECT_EQ(0, Run({"train", "--resume", resume, "--data", dir_ + "/moved.txt"}, &out)) << out;
  EXPECT_NE(out.find("moved.txt\" (the same content)"), std::string::npos) << out;
  // What may change is applied and printed: --steps always, --lr when asked for.
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", resume, "--steps", "5", "--lr", "0.002",
                    "--allow-schedule-change", "--json", dir_ + "/r.json"},
                   &out))
      << out;
  EXPECT_NE(out.find("--steps: 3 -> 5"), std::string::npos) << out;
  EXPECT_NE(out.find("--lr: 0.001 -> 0.002"), std::string::npos) << out;
  const nlohmann::json r = Json(dir_ + "/r.json");
  EXPECT_EQ(r["config"]["resumed_step"], 3);
  EXPECT_EQ(r["steps"].size(), 2u);
  // The record now holds what the run continued with.
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", resume, "--print-config"}, &out)) << out;
  EXPECT_NE(out.find("steps = 5\n"), std::string::npos) << out;
  EXPECT_NE(out.find("lr = 0.002\n"), std::string::npos) << out;
  // --state-dtype: refused naming the way out, converted with it (fp32 -> int8 -> fp32), and
  // recorded: the next resume without the flag continues in the new format.
  out.clear();
  EXPECT_EQ(1, Run({"train", "--resume", resume, "--state-dtype", "int8"}, &out)) << out;
  EXPECT_NE(out.find("--allow-state-dtype-change"), std::string::npos) << out;
  // Killed before the converted moments' first commit: the record still names the stored
  // format, so the store verifies (a record saying int8 over fp32 extents read as damage).
  out.clear();
  ::setenv("STRATA_TEST_KILL_AT", "commit_begin:1", 1);
  const int killed = Run({"train", "--resume", resume, "--steps", "6", "--state-dtype", "int8",
                          "--allow-state-dtype-change", "--durable"},
                         &out);
  ::unsetenv("STRATA_TEST_KILL_AT");
  ASSERT_EQ(137, killed) << out;
  out.clear();
  EXPECT_EQ(0, Run({"verify", resume}, &out)) << out;
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", resume, "--steps", "6", "--state-dtype", "int8",
                    "--allow-state-dtype-change"},
                   &out))
      << out;
  EXPECT_NE(out.find("--state-dtype: \"fp32\" -> \"int8\""), std::string::npos) << out;
  EXPECT_NE(out.find("converted from fp32 to int8"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", resume, "--steps", "7"}, &out)) << out;
  // Killed right after the first converted commit, before the plain record replaces the one
  // that names the conversion: that record says which format each commit holds, so the store
  // verifies as fp32 and the next resume alone continues it (no conversion, no refusal).
  out.clear();
  ::setenv("STRATA_TEST_KILL_AT", "committed:1", 1);
  const int killed_after = Run({"train", "--resume", resume, "--steps", "8", "--state-dtype",
                                "fp32", "--allow-state-dtype-change", "--durable"},
                               &out);
  ::unsetenv("STRATA_TEST_KILL_AT");
  ASSERT_EQ(137, killed_after) << out;
  EXPECT_NE(out.find("converted from int8 to fp32"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(0, Run({"verify", resume, "--json", dir_ + "/v.json"}, &out)) << out;
  const nlohmann::json v = Json(dir_ + "/v.json");
  EXPECT_EQ(v["step"], 8) << v.dump();
  EXPECT_EQ(v["dtypes"]["exp_avg"], "fp32") << v.dump();
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", resume, "--steps", "9"}, &out)) << out;
  EXPECT_EQ(out.find("converted"), std::string::npos) << out;
}

// The header's __metadata__ of a safetensors file.
nlohmann::json Metadata(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char len[8] = {};
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  return nlohmann::json::parse(header)["__metadata__"];
}

// --save records the geometry; generate, eval and train --init read it and need no
// geometry flag; one that contradicts the file is an error naming both values.
TEST_F(TrainCliTest, SavedGeometryNeedsNoFlags) {
  const std::string m = dir_ + "/m.safetensors";
  std::string out;
  ASSERT_EQ(0, Run({"train", "--layers", "1", "--d-model", "64", "--heads", "4", "--seq-len", "16",
                    "--batch", "2", "--steps", "2", "--save", m},
                   &out))
      << out;
  const nlohmann::json meta = Metadata(m);
  EXPECT_EQ(meta["n_head"], "4");
  EXPECT_EQ(meta["n_layer"], "1");
  EXPECT_EQ(meta["n_embd"], "64");
  EXPECT_EQ(meta["n_positions"], "16");
  EXPECT_EQ(meta["vocab_size"], "256");
  EXPECT_EQ(meta["format"], "pt");

  out.clear();
  ASSERT_EQ(0, Run({"eval", "--init", m}, &out)) << out;
  EXPECT_NE(out.find("4 heads"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(0, Run({"generate", "--init", m, "--tokens", "5"}, &out)) << out;
  out.clear();
  ASSERT_EQ(0, Run({"train", "--init", m, "--seq-len", "16", "--batch", "2", "--steps", "1"}, &out))
      << out;
  EXPECT_NE(out.find("d_model 64, 4 heads"), std::string::npos) << out;

  out.clear();
  EXPECT_EQ(1, Run({"generate", "--init", m, "--heads", "2"}, &out));
  EXPECT_NE(out.find("--heads 2 contradicts " + m + ", which records n_head = 4"),
            std::string::npos)
      << out;
  out.clear();
  EXPECT_EQ(1, Run({"eval", "--init", m, "--heads", "1"}, &out));
  EXPECT_NE(out.find("--heads 1 contradicts"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(1, Run({"train", "--init", m, "--d-model", "128", "--steps", "1"}, &out));
  EXPECT_NE(out.find("--d-model 128 contradicts " + m + ", whose tensors give d_model 64"),
            std::string::npos)
      << out;
}

// Every flag of train is either part of the run's record (--print-config lists it) or one
// of the few that only steer this invocation: a new flag must be classified in
// TrainSettings (tools/strata/train_args.cc), or --resume would silently drop it.
TEST_F(TrainCliTest, EveryFlagIsRecordedOrSteersTheInvocation) {
  std::string help, printed;
  ASSERT_EQ(0, Run({"train", "--help"}, &help));
  ASSERT_EQ(0, Run({"train", "--print-config"}, &printed));
  const std::set<std::string> invocation = {"help",
                                            "config",
                                            "resume",
                                            "print-config",
                                            "allow-schedule-change",
                                            "no-durable",
                                            "no-recompute",
                                            "rendezvous",
                                            "allow-state-dtype-change",
                                            "run-secret",
                                            "run-secret-file"};
  std::istringstream lines(help);
  std::string line;
  int flags = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("  -", 0) != 0) continue;
    std::istringstream names(line.substr(2, line.find(' ', 2) - 2));
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name.rfind("--", 0) != 0) continue;
      name = name.substr(2, name.find_first_of("{=") - 2);  // "--no-durable{false}"
      ++flags;
      if (invocation.count(name) > 0) continue;
      EXPECT_NE(printed.find("\n" + name + " = "), std::string::npos)
          << "--" << name << " is neither recorded nor listed as steering the invocation";
    }
  }
  EXPECT_GT(flags, 30) << help;
}

// --grad-dtype bf16 on the CPU path (the rounding emulation of the CUDA one): the gradient
// crosses device -> host in half the bytes, the losses move by a little (the gradient is
// rounded to bf16), not by nothing (the rounding ran) and not by much; the record keeps it.
TEST_F(TrainCliTest, Bf16GradientsHalveTheD2hBytes) {
  std::string out;
  ASSERT_EQ(0, Run(Args({"--json", dir_ + "/f.json"}), &out)) << out;
  ASSERT_EQ(0, Run(Args({"--grad-dtype", "bf16", "--json", dir_ + "/g.json"}), &out)) << out;
  const nlohmann::json f = Json(dir_ + "/f.json"), g = Json(dir_ + "/g.json");
  EXPECT_EQ(g["config"]["grad_dtype"], "bf16");
  EXPECT_EQ(f["config"]["grad_dtype"], "fp32");
  ASSERT_EQ(f["steps"].size(), g["steps"].size());
  double max_rel = 0;
  bool differs = false;
  for (size_t i = 0; i < f["steps"].size(); ++i) {
    const auto& a = f["steps"][i];
    const auto& b = g["steps"][i];
    EXPECT_EQ(b["bytes"]["d2h"].get<uint64_t>() * 2, a["bytes"]["d2h"].get<uint64_t>()) << i;
    // The planner predicts what crossed.
    EXPECT_EQ(b["bytes"]["d2h"], g["placement"]["predicted_bytes"]["d2h"]) << i;
    EXPECT_EQ(a["bytes"]["d2h"], f["placement"]["predicted_bytes"]["d2h"]) << i;
    const double la = a["loss"], lb = b["loss"];
    max_rel = std::max(max_rel, std::fabs(la - lb) / la);
    differs = differs || la != lb;
  }
  std::printf("[grad-dtype] max relative loss difference bf16 vs fp32 over %zu steps: %.3g\n",
              f["steps"].size(), max_rel);
  EXPECT_TRUE(differs);
  EXPECT_LT(max_rel, 0.01);
  // Offloaded (the budgets of kModel) and resident give the same bits with bf16 gradients too.
  ASSERT_EQ(0, Run({"train", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "16",
                    "--batch", "2", "--steps", "30", "--lr", "3e-3", "--grad-dtype", "bf16",
                    "--json", dir_ + "/r.json"},
                   &out))
      << out;
  const nlohmann::json r = Json(dir_ + "/r.json");
  ASSERT_EQ(r["steps"].size(), g["steps"].size());
  for (size_t i = 0; i < g["steps"].size(); ++i) {
    EXPECT_EQ(r["steps"][i]["loss"].get<double>(), g["steps"][i]["loss"].get<double>()) << i;
  }
  // Several micro-batches, resident (where auto would pick layer-major and sum them on the
  // device): batch-major instead (the model cannot sum bf16 gradients there), and it says so.
  out.clear();
  ASSERT_EQ(0, Run({"train", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "16",
                    "--batch", "2", "--steps", "3", "--grad-dtype", "bf16", "--micro-batches", "2"},
                   &out))
      << out;
  EXPECT_NE(out.find("batch-major: with --grad-dtype bf16"), std::string::npos) << out;
  // A bad value names the flag (with ranks: TrainMultirankTest.Bf16GradientsAcrossTwoRanks).
  out.clear();
  EXPECT_NE(0, Run(Args({"--grad-dtype", "fp16"}), &out));
  EXPECT_NE(out.find("--grad-dtype"), std::string::npos) << out;
}

// --json has one record per committed step, each with the step's final statistics: with
// pipelined updates (the default) a step commits during the next one and its record comes
// then (the last after the final flush), complete and in order, its nvme_write bytes those
// of its own updates, so step for step the same as --pipeline off; same losses; each
// validation loss on its own step.
TEST_F(TrainCliTest, JsonRecordsEachCommittedStepWithItsFinalStats) {
  std::string out;
  nlohmann::json runs[2];
  for (int k = 0; k < 2; ++k) {
    const std::string name = k == 1 ? "on" : "off";
    ASSERT_EQ(0, Run(Args({"--nvme", dir_ + "/" + name, "--pipeline", name, "--val-every", "10",
                           "--json", dir_ + "/" + name + ".json"}),
                     &out))
        << out;
    runs[k] = Json(dir_ + "/" + name + ".json");
  }
  EXPECT_NE(out.find("step    30/30"), std::string::npos) << out;
  const nlohmann::json& off = runs[0]["steps"];
  const nlohmann::json& on = runs[1]["steps"];
  ASSERT_EQ(on.size(), 30u);
  ASSERT_EQ(off.size(), 30u);
  for (size_t i = 0; i < on.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(on[i]["step"], int64_t(i) + 1);
    EXPECT_EQ(on[i]["loss"].get<double>(), off[i]["loss"].get<double>());
    EXPECT_GT(on[i]["deferred_blocks"].get<int64_t>(), 0);
    EXPECT_EQ(off[i]["deferred_blocks"].get<int64_t>(), 0);
    EXPECT_GT(on[i]["bytes"]["nvme_write"].get<uint64_t>(), 0u);
    EXPECT_EQ(on[i]["bytes"]["nvme_write"].get<uint64_t>(),
              off[i]["bytes"]["nvme_write"].get<uint64_t>());
    EXPECT_GT(on[i]["busy_seconds"]["cpu_optim"].get<double>(), 0.0);
    EXPECT_EQ(on[i].contains("val_loss"), (i + 1) % 10 == 0);
    if ((i + 1) % 10 == 0) {
      EXPECT_EQ(on[i]["val_loss"].get<double>(), off[i]["val_loss"].get<double>());
    }
    // Its updates ran under the next step, but where a read between steps (validation) or
    // the final flush ran them.
    if ((i + 1) % 10 != 0) {
      EXPECT_GT(on[i]["overlapped_seconds"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(runs[1]["totals"]["bytes"]["nvme_write"], runs[0]["totals"]["bytes"]["nvme_write"]);
}

// One rule for the default head count: d_model / 64 in train as in generate.
TEST_F(TrainCliTest, DefaultHeadsAreOneRule) {
  std::string out;
  ASSERT_EQ(0, Run({"train", "--d-model", "128", "--print-config"}, &out)) << out;
  EXPECT_NE(out.find("heads = 2\n"), std::string::npos) << out;
}

// --config: every section names a command and every key a flag of it; --print-config
// writes a file --config reads back to the same configuration.
TEST_F(TrainCliTest, ConfigSectionsAndKeysAreChecked) {
  auto write = [&](const std::string& text) {
    std::ofstream(dir_ + "/c.toml") << text;
    return dir_ + "/c.toml";
  };
  std::string out;
  EXPECT_EQ(1, Run({"train", "--config", write("[trian]\nlayers = 1\n"), "--steps", "1"}, &out));
  EXPECT_NE(out.find("section [trian] is not a strata command"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(1, Run({"train", "--config", write("[generate]\nlayers = 1\n"), "--steps", "1"}, &out));
  EXPECT_NE(out.find("'layers' in [generate] is not a flag of strata generate"), std::string::npos)
      << out;
  out.clear();
  EXPECT_EQ(1, Run({"train", "--config", write("[train]\nlayer = 1\n"), "--steps", "1"}, &out));
  EXPECT_NE(out.find("'layer' in [train] is not a flag of strata train"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(1, Run({"generate", "--config", write("[bench.step]\nnosuch = 1\n")}, &out));
  EXPECT_NE(out.find("'nosuch' in [bench.step] is not a flag of strata bench step"),
            std::string::npos)
      << out;
  // Every command but launch and env reads one.
  out.clear();
  EXPECT_EQ(0, Run({"bench", "adam", "--config",
                    write("[bench.adam]\nparams = \"64K\"\niters = 1\nwarmup = 0\n")},
                   &out))
      << out;
  EXPECT_NE(out.find("params: 65536"), std::string::npos) << out;

  // A workflow file: [train] for train, [generate] for generate.
  const std::string m = dir_ + "/w.safetensors";
  write(
      "[train]\nlayers = 1\nd-model = 32\nheads = 2\nseq-len = 16\nbatch = 2\nsteps = 2\n"
      "save = \"" +
      m + "\"\n[generate]\ninit = \"" + m + "\"\ntokens = 4\nprompt = \"ab\"\n");
  out.clear();
  ASSERT_EQ(0, Run({"train", "--config", dir_ + "/c.toml"}, &out)) << out;
  out.clear();
  ASSERT_EQ(0, Run({"generate", "--config", dir_ + "/c.toml"}, &out)) << out;
  EXPECT_EQ(out.rfind("ab", 0), 0u) << out;

  // --print-config round trip.
  std::string printed, again;
  ASSERT_EQ(0, Run({"train", "--layers", "3", "--lr", "0.0012345678901", "--nvme", dir_,
                    "--print-config"},
                   &printed));
  write(printed);
  ASSERT_EQ(0, Run({"train", "--config", dir_ + "/c.toml", "--print-config"}, &again));
  EXPECT_EQ(printed, again);
  EXPECT_NE(printed.find("lr = 0.0012345678901\n"), std::string::npos) << printed;
  // Without --nvme (an empty array) the printed file runs as it is.
  printed.clear();
  ASSERT_EQ(0, Run({"train", "--layers", "1", "--d-model", "32", "--seq-len", "8", "--batch", "2",
                    "--steps", "1", "--print-config"},
                   &printed));
  write(printed);
  out.clear();
  EXPECT_EQ(0, Run({"train", "--config", dir_ + "/c.toml"}, &out)) << out;
}

}  // namespace
