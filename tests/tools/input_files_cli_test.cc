// The files a flag names, end to end through the built binary: --config, --io-config,
// --init and --tokenizer must be regular files of a bounded size (a folder, /dev/zero or a
// FIFO is one line naming the flag and the path, never an empty config, a read until memory
// runs out or a wait for a writer forever); a --config that CLI11's lenient reader would
// misread (a string or an array left open, a '#' inside a quoted value) is refused naming the
// line; a UTF-8 byte order mark is read past. Counts that would exhaust the host (--threads,
// launch -n) are refused, and --steps near the int64 limit trains (and stops on SIGTERM).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Contains;
using strata::testing::ShellQuote;

const std::vector<std::string> kTrain = {
    "train", "--layers", "1", "--d-model",  "32",        "--heads", "1", "--seq-len",
    "16",    "--batch",  "2", "--host-mem", "unlimited", "--steps", "1"};

class InputFilesCliTest : public ::testing::Test {
 protected:
  // `strata <args>` with a hang guard of `timeout_s` (a FIFO once blocked forever: 137).
  CliRun Strata(const std::vector<std::string>& args, int timeout_s = 60) {
    strata::testing::CliRunOptions o;
    o.timeout_s = timeout_s;
    o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
    return strata::testing::RunCli(ShellQuote(args), o);
  }
  CliRun Train(std::vector<std::string> extra, int timeout_s = 60) {
    std::vector<std::string> args = kTrain;
    args.insert(args.end(), extra.begin(), extra.end());
    return Strata(args, timeout_s);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = tmp_.File(name);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string Fifo() {
    const std::string path = tmp_.File("fifo");
    if (!std::filesystem::exists(path)) {
      EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
    }
    return path;
  }
  // Paths that are not regular files: a folder, a character device, a FIFO no one writes.
  std::vector<std::string> NotFiles() { return {tmp_.path(), "/dev/zero", Fifo()}; }
  // One line naming `flag` and `path`, exit code 1, before any step.
  static void ExpectRefused(const CliRun& r, const std::string& flag, const std::string& path) {
    EXPECT_EQ(r.exit_code, 1) << flag << " " << path << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, flag)) << r.output;
    EXPECT_TRUE(Contains(r.output, path)) << r.output;
    EXPECT_FALSE(Contains(r.output, "step ")) << r.output;
    EXPECT_FALSE(Contains(r.output, "terminate called")) << r.output;
  }
  strata::testing::TempDir tmp_{"strata-input-files"};
};

// Before: a folder or /dev/zero read as an empty config (exit 0), a FIFO blocked forever.
TEST_F(InputFilesCliTest, ConfigThatIsNotARegularFileIsRefused) {
  for (const std::string& path : NotFiles()) {
    for (const std::vector<std::string>& cmd :
         {std::vector<std::string>{"train", "--print-config"}, {"generate", "--init", "x"}}) {
      std::vector<std::string> args = cmd;
      args.insert(args.end(), {"--config", path});
      const CliRun r = Strata(args, 20);
      ExpectRefused(r, "--config", path);
      EXPECT_TRUE(Contains(r.output, "not a regular file")) << r.output;
    }
  }
  // Bounded: a config of more than 1 MiB is not a flags file.
  const std::string big = tmp_.File("big.toml");
  std::filesystem::resize_file(Write("big.toml", "layers = 2\n"), 2 << 20);
  const CliRun r = Strata({"train", "--print-config", "--config", big}, 20);
  ExpectRefused(r, "--config", big);
  EXPECT_TRUE(Contains(r.output, "MiB")) << r.output;
}

// Before: `save = "out.safetensors` (no closing quote) trained and wrote a file named
// `"out.safetensors`; an array left open swallowed the lines after it; a '#' inside quotes
// cut the value (CLI11 reads it as a comment) and kept the opening quote.
TEST_F(InputFilesCliTest, ConfigWithAnOpenStringOrArrayIsRefusedNamingTheLine) {
  const std::string cwd = std::filesystem::current_path();
  ASSERT_EQ(::chdir(tmp_.path().c_str()), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"# run\nsave = \"out.safetensors\n", "line 2"},
      {"save = 'out.safetensors\n", "line 1"},
      {"steps = 1\nnvme = [\"a\", \"b\"\nlayers = 1\n", "line 2"},
      {"save = \"out#1.safetensors\"\n", "line 1"},
      {"save = \"\"\"out.safetensors\"\"\"\n", "line 1"},
      {"nvme = [\"a, \"b\"]\n", "line 1"},
  };
  int i = 0;
  for (const auto& [text, line] : cases) {
    const std::string path = Write("c" + std::to_string(i++) + ".toml", text);
    const CliRun r = Train({"--config", path});
    EXPECT_EQ(r.exit_code, 1) << text << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "--config " + path + ": " + line)) << text << "\n" << r.output;
    EXPECT_FALSE(Contains(r.output, "step ")) << r.output;
  }
  for (const auto& e : std::filesystem::directory_iterator(tmp_.path())) {
    EXPECT_EQ(e.path().filename().string().find('"'), std::string::npos) << e.path();
    EXPECT_EQ(e.path().filename().string().find('\''), std::string::npos) << e.path();
  }
  ASSERT_EQ(::chdir(cwd.c_str()), 0);
  // Strings that are closed are read as they were, and an array may span lines (an '=' in
  // a quoted element does not end it).
  const std::string lines = Write("lines.toml", "nvme = [\"/a\",\n  \"/b=c\",\n  \"/d\"]\n");
  const CliRun multi = Strata({"train", "--config", lines, "--print-config"});
  EXPECT_EQ(multi.exit_code, 0) << multi.output;
  EXPECT_TRUE(Contains(multi.output, "nvme = [\"/a\", \"/b=c\", \"/d\"]")) << multi.output;
  const std::string ok = Write("ok.toml", "save = 'a \"quoted\" name.safetensors'\nlayers = 3\n");
  const CliRun r = Strata({"train", "--config", ok, "--print-config"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "layers = 3")) << r.output;
  EXPECT_TRUE(Contains(r.output, "a \"quoted\" name.safetensors'")) << r.output;
}

// Before: "'\xEF\xBB\xBFlayers' in [train] is not a flag" (the mark invisible in the message).
TEST_F(InputFilesCliTest, ConfigWithAByteOrderMarkIsRead) {
  const std::string path = Write("bom.toml", "\xEF\xBB\xBFlayers = 3\nd-model = 96\n");
  const CliRun r = Strata({"train", "--config", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "layers = 3")) << r.output;
  EXPECT_TRUE(Contains(r.output, "d-model = 96")) << r.output;
  // An invisible character elsewhere is shown escaped, not printed as is.
  const std::string odd = Write("odd.toml", "lay\x01rs = 3\n");
  const CliRun bad = Strata({"train", "--config", odd, "--print-config"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(Contains(bad.output, "lay\\x01rs")) << bad.output;
  EXPECT_FALSE(Contains(bad.output, "\x01")) << bad.output;
}

// Before: a FIFO blocked forever and /dev/zero was read until memory ran out.
TEST_F(InputFilesCliTest, IoConfigThatIsNotARegularFileIsRefused) {
  for (const std::string& path : NotFiles()) {
    const CliRun r = Train({"--nvme", tmp_.path(), "--io-config", path}, 20);
    ExpectRefused(r, "--io-config", path);
    EXPECT_TRUE(Contains(r.output, "not a regular file")) << r.output;
  }
  const std::string big = tmp_.File("big.json");
  std::filesystem::resize_file(Write("big.json", "{}"), 2 << 20);
  ExpectRefused(Train({"--io-config", big}, 20), "--io-config", big);
  EXPECT_FALSE(std::filesystem::exists(tmp_.File("strata.manifest")));
}

// Before: a FIFO blocked forever, a folder failed with "out of memory" (its size as lseek
// gives it), /dev/zero read as an empty file.
TEST_F(InputFilesCliTest, InitAndTokenizerThatAreNotRegularFilesAreRefused) {
  for (const std::string& path : NotFiles()) {
    for (const std::string flag : {"--init", "--tokenizer"}) {
      const CliRun r = Train({flag, path}, 20);
      ExpectRefused(r, flag, path);
      EXPECT_TRUE(Contains(r.output, "not a regular file")) << r.output;
    }
    const CliRun g = Strata({"generate", "--init", path, "--tokens", "1"}, 20);
    ExpectRefused(g, "--init", path);
  }
}

// Before: 100000 threads (OpenMP teams) or ranks (processes) were started.
TEST_F(InputFilesCliTest, ThreadAndRankCountsAreBounded) {
  const CliRun t = Train({"--threads", "100000"});
  EXPECT_EQ(t.exit_code, 1) << t.output;
  EXPECT_TRUE(Contains(t.output, "--threads 100000")) << t.output;
  EXPECT_TRUE(Contains(t.output, "1024")) << t.output;
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"generate", "--init", "x", "--threads", "100000"},
        {"eval", "--init", "x", "--threads", "100000"},
        {"bench", "model", "--threads", "100000"},
        {"bench", "adam", "--threads", "1,100000"},
        {"bench", "step", "--threads", "100000"}}) {
    const CliRun r = Strata(cmd, 20);
    EXPECT_NE(r.exit_code, 0) << cmd[1] << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "--threads")) << r.output;
    EXPECT_TRUE(Contains(r.output, "1024")) << r.output;
  }
  // The same count from the environment: refused by name before anything runs.
  ::setenv("STRATA_NUM_THREADS", "100000", 1);
  const CliRun env = Train({});
  ::unsetenv("STRATA_NUM_THREADS");
  EXPECT_EQ(env.exit_code, 1) << env.output;
  EXPECT_TRUE(Contains(env.output, "STRATA_NUM_THREADS=100000: at most 1024")) << env.output;
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"launch", "-n", "100000", "--", "true"},
        {"launch", "-n", "2", "--nnodes", "100000", "--node-rank", "0", "--rendezvous",
         "file:" + tmp_.path(), "--", "true"}}) {
    const CliRun r = Strata(cmd, 20);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(Contains(r.output, "100000")) << r.output;
    EXPECT_TRUE(Contains(r.output, "at most")) << r.output;
  }
}

// Before: DefaultLogEvery overflowed int64 (from about 5e18 steps, depending on how the
// overflow wrapped) and spun before the first step, deaf to SIGTERM.
TEST_F(InputFilesCliTest, StepsNearTheInt64LimitTrainAndStopOnSigterm) {
  std::vector<std::string> args = kTrain;
  args.back() = "9223372036854775807";  // INT64_MAX
  args.insert(args.end(), {"--log-every", "0"});
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    ::close(p[0]);
    ::close(p[1]);
    std::vector<char*> argv = {const_cast<char*>(STRATA_CLI_PATH)};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(STRATA_CLI_PATH, argv.data());
    ::_exit(127);
  }
  ::close(p[1]);
  // Reads what comes until `done` says so or `seconds` pass; false on a timeout.
  std::string out;
  auto read_until = [&](auto done, int seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      pollfd pfd{p[0], POLLIN, 0};
      if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      const ssize_t n = ::read(p[0], buf, sizeof buf);
      if (n <= 0) return true;  // the end: `done` decides
      out.append(buf, static_cast<size_t>(n));
    }
    return true;
  };
  const bool stepped = read_until([&] { return Contains(out, "step     1/"); }, 60);
  ::kill(pid, SIGTERM);
  read_until([] { return false; }, 30);  // to the end of its output
  int status = 0;
  pid_t reaped = 0;
  for (int i = 0; i < 50 && reaped == 0; ++i) {
    reaped = ::waitpid(pid, &status, WNOHANG);
    if (reaped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (reaped != pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ::close(p[0]);
  EXPECT_TRUE(stepped) << "no step within 60 s\n" << out;
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal (ignored SIGTERM?)\n" << out;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << out;
  EXPECT_TRUE(Contains(out, "interrupted (SIGTERM) at step")) << out;
}

}  // namespace
