// `strata train` end to end: a run killed (SIGKILL) part-way and resumed with --resume alone
// gives exactly the losses of the uninterrupted run from the step after its last commit; a
// resume that would train another run is refused, listing each difference; --json has the
// documented fields; bad flags fail with a message naming the value; --save records the
// geometry that generate, eval and train --init then need no flags for; --config files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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
  pid_t Spawn(std::vector<std::string> args, int* out_fd) {
    int p[2];
    EXPECT_EQ(0, pipe(p));
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
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
  EXPECT_GE(from, 3);
  EXPECT_LT(from, 30) << "the kill came after the last step; nothing left to compare";
  ASSERT_EQ(resumed["steps"].size(), static_cast<size_t>(30 - from));
  for (const auto& s : resumed["steps"]) {
    const int64_t k = s["step"];
    EXPECT_EQ(s["loss"].get<double>(), full["steps"][k - 1]["loss"].get<double>()) << "step " << k;
  }
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
// TrainSettings (tools/strata/train.cc), or --resume would silently drop it.
TEST_F(TrainCliTest, EveryFlagIsRecordedOrSteersTheInvocation) {
  std::string help, printed;
  ASSERT_EQ(0, Run({"train", "--help"}, &help));
  ASSERT_EQ(0, Run({"train", "--print-config"}, &printed));
  const std::set<std::string> invocation = {
      "help",       "config",    "resume", "print-config", "allow-schedule-change",
      "no-durable", "rendezvous"};
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
