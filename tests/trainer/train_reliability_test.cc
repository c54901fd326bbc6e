// `strata train` against bad input, end to end through the binary: every bad flag, file or
// environment value is one clear line and exit code 1 before any work starts (never an
// abort, a hang or a crash), and outputs never land outside the path named.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/manifest.h"
#include "model/safetensors.h"
#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::Contains;
using strata::testing::RunCli;
using strata::testing::ShellQuote;

// The issue's `T`, two steps.
const std::vector<std::string> kTiny = {
    "train", "--layers",   "2",  "--d-model", "64", "--heads", "2",   "--seq-len", "32", "--batch",
    "4",     "--host-mem", "2M", "--steps",   "2",  "--lr",    "1e-3"};

class TrainReliabilityTest : public ::testing::Test {
 protected:
  // Runs kTiny + extra; `env` ("NAME=value") is set for the command only.
  strata::testing::CliRun Train(const std::vector<std::string>& extra,
                                const std::string& env = "") {
    // A flag already in kTiny takes the new value (CLI11 refuses a flag given twice).
    std::vector<std::string> args = kTiny;
    for (size_t i = 0; i < extra.size(); ++i) {
      auto it = std::find(args.begin(), args.end(), extra[i]);
      if (it != args.end() && i + 1 < extra.size() && extra[i].rfind("--", 0) == 0 &&
          it + 1 != args.end()) {
        *(it + 1) = extra[++i];
      } else {
        args.push_back(extra[i]);
      }
    }
    strata::testing::CliRunOptions o;
    o.timeout_s = 120;
    std::string name;
    if (!env.empty()) {
      name = env.substr(0, env.find('='));
      ::setenv(name.c_str(), env.substr(env.find('=') + 1).c_str(), 1);
    }
    auto r = RunCli(ShellQuote(args), o);
    if (!name.empty()) ::unsetenv(name.c_str());
    return r;
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  // Lines of output that are not '#' comments.
  static std::vector<std::string> Messages(const std::string& out) {
    std::vector<std::string> lines;
    size_t pos = 0;
    while (pos < out.size()) {
      size_t end = out.find('\n', pos);
      if (end == std::string::npos) end = out.size();
      std::string line = out.substr(pos, end - pos);
      if (!line.empty() && line[0] != '#') lines.push_back(line);
      pos = end + 1;
    }
    return lines;
  }
  strata::testing::TempDir tmp_{"strata-rel"};
  const std::string dir_ = tmp_.path();
};

TEST_F(TrainReliabilityTest, DataThatIsNotAFileIsOneLineNotAnAbort) {
  for (const std::string& data : {dir_, std::string("/proc/self/mem")}) {
    const auto r = Train({"--data", data});
    EXPECT_EQ(r.exit_code, 1) << data << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "--data")) << r.output;
    EXPECT_TRUE(Contains(r.output, data)) << r.output;
    EXPECT_FALSE(Contains(r.output, "terminate called")) << r.output;
  }
}

TEST_F(TrainReliabilityTest, HugeBatchIsRefusedNotAnAbort) {
  const auto r = Train({"--batch", "2000000000"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(Contains(r.output, "terminate called")) << r.output;
  EXPECT_EQ(Messages(r.output).size(), 1u) << r.output;
}

// Sizes that overflow 64 bits (the planner spun forever) or exceed the host (memory grew
// without a message) are refused before anything is planned, with the numbers.
TEST_F(TrainReliabilityTest, OversizedRunsAreRefusedUpFrontWithTheNumbers) {
  const std::vector<std::vector<std::string>> cases = {{"--d-model", "2000000000"},
                                                       {"--layers", "2000000"},
                                                       {"--layers", "2000000", "--nvme", dir_},
                                                       {"--batch", "2000000000"}};
  for (const auto& c : cases) {
    const auto r = Train(c);
    EXPECT_EQ(r.exit_code, 1) << c[0] << " " << c[1] << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "TiB")) << r.output;
    EXPECT_EQ(Messages(r.output).size(), 1u) << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/strata.manifest"));
}

// Every value that can be checked before the first step is refused then, naming the flag,
// before the store is created (a folder holding a store then refuses a fresh run): before,
// --lr nan failed at step 1 and the rest ran to the end, outputs failing after the last step.
TEST_F(TrainReliabilityTest, BadFlagsAreRefusedBeforeTheStoreIsCreated) {
  const std::string missing = dir_ + "/missing/out";
  const std::vector<std::vector<std::string>> cases = {
      {"--lr", "nan"},
      {"--lr", "-1"},
      {"--warmup", "-3"},
      {"--val-every", "-1"},
      {"--sample", "-5"},
      {"--sample", "3", "--temperature", "nan"},
      {"--beta1", "nan"},
      {"--beta2", "1"},
      {"--eps", "-1"},
      {"--weight-decay", "nan"},
      {"--grad-clip", "nan"},
      {"--threads", "-2"},
      {"--save", missing},
      {"--json", missing},
      {"--trace", missing},
      {"--save", dir_},
      {"--optimizer-threads", "-1"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string nvme = dir_ + "/nvme" + std::to_string(i++);
    std::filesystem::create_directory(nvme);
    std::vector<std::string> args = c;
    args.insert(args.end(), {"--nvme", nvme});
    const auto r = Train(args);
    const std::string flag = c.size() > 2 ? c[2] : c[0];
    EXPECT_EQ(r.exit_code, 1) << flag << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, flag + " ")) << r.output;
    EXPECT_EQ(Messages(r.output).size(), 1u) << r.output;
    EXPECT_TRUE(std::filesystem::is_empty(nvme)) << flag << ": the store was created";
  }
}

TEST_F(TrainReliabilityTest, DurableWithoutNvmeIsRefused) {
  const auto r = Train({"--durable"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "--durable")) << r.output;
  EXPECT_TRUE(Contains(r.output, "--nvme")) << r.output;
  EXPECT_TRUE(Train({"--no-durable"}).exit_code == 0);
}

// A budget of 0 used to mean unlimited without a word; the word says it now and 0 is refused.
TEST_F(TrainReliabilityTest, ZeroBudgetIsRefusedAndUnlimitedIsAWord) {
  for (const std::string flag : {"--host-mem", "--device-mem"}) {
    const auto zero = Train({flag, "0"});
    EXPECT_EQ(zero.exit_code, 1) << flag << "\n" << zero.output;
    EXPECT_TRUE(Contains(zero.output, flag + " 0")) << zero.output;
    EXPECT_TRUE(Contains(zero.output, "unlimited")) << zero.output;
    const auto unlimited = Train({flag, "unlimited", "--steps", "1"});
    EXPECT_EQ(unlimited.exit_code, 0) << flag << "\n" << unlimited.output;
  }
  const auto help = RunCli("train --help");
  EXPECT_TRUE(Contains(help.output, "unlimited")) << help.output;
}

// --steps counts the resumed steps: resuming with --steps at or below the stored step trains
// nothing, and says so (before, it ran 0 steps without a word).
TEST_F(TrainReliabilityTest, ResumeWithStepsAtOrBelowTheStoredStepSaysSo) {
  const std::string nvme = dir_ + "/n";
  std::filesystem::create_directory(nvme);
  ASSERT_EQ(Train({"--nvme", nvme, "--steps", "3"}).exit_code, 0);
  for (const std::string steps : {"3", "2"}) {
    const auto r = Train({"--nvme", nvme, "--resume", nvme, "--steps", steps});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "--steps " + steps)) << r.output;
    EXPECT_TRUE(Contains(r.output, "already holds step 3")) << r.output;
  }
  const auto more = Train({"--nvme", nvme, "--resume", nvme, "--steps", "4"});
  EXPECT_EQ(more.exit_code, 0) << more.output;
  EXPECT_FALSE(Contains(more.output, "nothing to train")) << more.output;
}

// Errors that reach the user name the flag to change, not the library's API (before: "resume
// it (EngineOptions::resume, --resume)", "engine: OutOfMemory: device budget ...").
TEST_F(TrainReliabilityTest, MessagesNameFlagsNotTheApi) {
  const std::string nvme = dir_ + "/n", empty = dir_ + "/e";
  std::filesystem::create_directory(nvme);
  std::filesystem::create_directory(empty);
  ASSERT_EQ(Train({"--nvme", nvme}).exit_code, 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nvme", nvme}, "--resume " + nvme},
      {{"--nvme", empty, "--resume", empty}, "--resume " + empty},
      {{"--device-mem", "1K"}, "--device-mem"},
      {{"--host-mem", "1K"}, "--host-mem"},
  };
  for (const auto& [args, flag] : cases) {
    const auto r = Train(args);
    EXPECT_EQ(r.exit_code, 1) << flag << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, flag)) << r.output;
    EXPECT_FALSE(Contains(r.output, "Options::")) << r.output;
    EXPECT_FALSE(Contains(r.output, "=true")) << r.output;
  }
}

// Under a permissive umask the store's files (swap files, manifest, lock) are private and the
// outputs (--save, --json, --trace) are 0644; a manifest rewritten to claim a huge capacity
// cannot make a resumed run preallocate it.
TEST_F(TrainReliabilityTest, FileModesAndNoInflatedPreallocation) {
  const std::string nvme = dir_ + "/n";
  std::filesystem::create_directory(nvme);
  const std::vector<std::string> outputs = {dir_ + "/w.safetensors", dir_ + "/r.json",
                                            dir_ + "/t.json"};
  const mode_t old = ::umask(0);
  const auto r =
      Train({"--nvme", nvme, "--save", outputs[0], "--json", outputs[1], "--trace", outputs[2]});
  ::umask(old);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto mode = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
    return st.st_mode & 0777;
  };
  int store_files = 0;
  uint64_t swap_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(nvme)) {
    EXPECT_EQ(mode(e.path().string()), 0600u) << e.path();
    if (e.path().filename().string().rfind("strata.swap.", 0) == 0) {
      swap_bytes += std::filesystem::file_size(e.path());
    }
    ++store_files;
  }
  EXPECT_GE(store_files, 3);  // a swap file, the manifest, the lock
  for (const std::string& out : outputs) EXPECT_EQ(mode(out), 0644u) << out;

  const std::string manifest = nvme + "/strata.manifest";
  auto m = strata::swap_internal::DecodeManifest(ReadAll(manifest), manifest);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  m->capacity_bytes = 1ull << 30;  // checksum and all
  std::ofstream(manifest, std::ios::binary | std::ios::trunc)
      << strata::swap_internal::EncodeManifest(*m);
  const auto resumed = Train({"--nvme", nvme, "--resume", nvme, "--steps", "3"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  uint64_t resumed_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(nvme)) {
    if (e.path().filename().string().rfind("strata.swap.", 0) == 0) {
      resumed_bytes += std::filesystem::file_size(e.path());
    }
  }
  EXPECT_LE(resumed_bytes, swap_bytes);
}

TEST_F(TrainReliabilityTest, UnknownOrUnsupportedCpuIsaIsRefusedAtStart) {
  const auto r = Train({"--nvme", dir_}, "STRATA_CPU_ISA=avx9000");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "STRATA_CPU_ISA='avx9000'")) << r.output;
  EXPECT_FALSE(Contains(r.output, "step")) << r.output;  // before anything ran
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/strata.manifest"));
}

TEST_F(TrainReliabilityTest, RandomBytesAsTextWarn) {
  std::string junk(64 * 1024, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : junk) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  std::ofstream(dir_ + "/junk.bin", std::ios::binary) << junk;
  const auto r = Train({"--data", dir_ + "/junk.bin", "--steps", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "does not look like text")) << r.output;
}

// A file with llm.c's magic is a token file: a version other than 1, or a header cut short,
// is an error naming the file, never trained on as text.
TEST_F(TrainReliabilityTest, LlmcMagicWithAWrongVersionIsAnError) {
  const int32_t header[256] = {20240520, 2, 64};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes.append(128, 'a');
  std::ofstream(dir_ + "/v2.bin", std::ios::binary) << bytes;
  std::ofstream(dir_ + "/short.bin", std::ios::binary) << bytes.substr(0, 12);
  for (const std::string name : {"v2.bin", "short.bin"}) {
    const auto r = Train({"--data", dir_ + "/" + name, "--steps", "1"});
    EXPECT_EQ(r.exit_code, 1) << name << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "llm.c token file")) << r.output;
    EXPECT_TRUE(Contains(r.output, name)) << r.output;
  }
}

}  // namespace

namespace {

// The committed step of the store in `nvme`, as a resume with --steps 1 reports it.
int64_t CommittedStep(const std::string& out) {
  const std::string key = "already holds step ";
  const size_t at = out.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(out.substr(at + key.size()));
}

}  // namespace

// --lr 1e4 diverges within a few steps. With clipping each non-finite step is skipped with a
// warning and --max-skipped-steps of them in a row stop the run; without clipping a
// non-finite gradient found after other blocks were updated stops the run at once. Either way no
// non-finite value is committed: the weights saved from the store's last commit are all finite
// (before, every commit replaced the last good state with NaN and the run ended with rc 0).
TEST_F(TrainReliabilityTest, DivergenceIsSkippedAndNeverCommitted) {
  for (const std::string clip : {"1", "0"}) {
    const std::string nvme = dir_ + "/n" + clip;
    std::filesystem::create_directory(nvme);
    const auto r = Train({"--nvme", nvme, "--durable", "--lr", "1e4", "--grad-clip", clip,
                          "--steps", "40", "--log-every", "1"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    if (clip == "1") {
      EXPECT_TRUE(Contains(r.output, "the update was skipped")) << r.output;
      EXPECT_TRUE(Contains(r.output, "3 steps in a row had a non-finite gradient")) << r.output;
    } else {
      // Which comes first, a finite block's update or the non-finite gradient's norm, is a
      // matter of timing: the step is skipped whole or stops the run uncommitted.
      EXPECT_TRUE(Contains(r.output, "is not committed") ||
                  Contains(r.output, "steps in a row had a non-finite gradient"))
          << r.output;
    }
    // Resuming with --steps 1 trains nothing (it names the committed step) and saves the
    // committed weights.
    const std::string saved = dir_ + "/w" + clip + ".safetensors";
    const auto held = Train({"--resume", nvme, "--lr", "1e4", "--steps", "1", "--save", saved});
    ASSERT_EQ(held.exit_code, 0) << held.output;
    ASSERT_GE(CommittedStep(held.output), 1) << held.output;
    auto reader = strata::model::SafetensorsReader::Open(saved);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    for (const auto& [name, entry] : reader->tensors()) {
      std::vector<float> v(static_cast<size_t>(entry.NumElements()));
      ASSERT_TRUE(reader->ReadFloat(name, entry.shape, v.data(), v.size()).ok()) << name;
      for (float x : v) ASSERT_TRUE(std::isfinite(x)) << clip << " " << name;
    }
  }
}

// A run stopped by --max-skipped-steps says how to resume with a lower --lr, naming
// --allow-schedule-change (a stored run refuses another --lr without it), and writes its
// --json with the steps it ran and the error (before: no --json at all, and a hint that, as
// given, the resume refused).
TEST_F(TrainReliabilityTest, StoppedBySkippedStepsWritesItsJsonAndAResumeHintThatWorks) {
  const std::string nvme = dir_ + "/n", json = dir_ + "/r.json";
  std::filesystem::create_directory(nvme);
  const auto r = Train({"--nvme", nvme, "--durable", "--lr", "1e4", "--grad-clip", "1", "--steps",
                        "40", "--json", json});
  ASSERT_EQ(r.exit_code, 1) << r.output;
  ASSERT_TRUE(Contains(r.output, "steps in a row had a non-finite gradient")) << r.output;
  EXPECT_TRUE(Contains(r.output, "--allow-schedule-change")) << r.output;
  ASSERT_TRUE(std::filesystem::exists(json)) << r.output;
  const nlohmann::json js = nlohmann::json::parse(ReadAll(json));
  EXPECT_GE(js["steps"].size(), 3u) << js.dump();
  // The step that stopped the run is not among them.
  EXPECT_GE(js["totals"]["skipped_steps"].get<int64_t>(), 2) << js.dump();
  EXPECT_TRUE(Contains(js["error"].get<std::string>(), "non-finite gradient")) << js.dump();
  // As the hint says: a lower --lr with --allow-schedule-change resumes (--steps 1: nothing
  // to train, the weights of this divergence may be past saving); without it, refused.
  const auto refused = Train({"--resume", nvme, "--lr", "1e-4", "--steps", "1"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(Contains(refused.output, "--allow-schedule-change")) << refused.output;
  const auto resumed =
      Train({"--resume", nvme, "--lr", "1e-4", "--allow-schedule-change", "--steps", "1"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_GE(CommittedStep(resumed.output), 1) << resumed.output;
}

// --init weights holding a NaN or an infinity are refused naming the tensor (before, they
// trained to rc 0 with a NaN loss).
TEST_F(TrainReliabilityTest, NonFiniteInitWeightsAreRefusedNamingTheTensor) {
  const std::string saved = dir_ + "/w.safetensors";
  ASSERT_EQ(Train({"--steps", "1", "--save", saved}).exit_code, 0);
  std::string bytes = ReadAll(saved);
  auto reader = strata::model::SafetensorsReader::Open(saved);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const std::string name = "h.1.mlp.c_fc.weight";
  const auto* entry = reader->Find(name);
  ASSERT_NE(entry, nullptr);
  ASSERT_EQ(entry->dtype, "F32");
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof header);
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::string patched = bytes;
    std::memcpy(&patched[8 + header + entry->begin + 4 * 5], &bad, sizeof bad);
    const std::string init = dir_ + "/bad.safetensors";
    std::ofstream(init, std::ios::binary) << patched;
    const auto r = Train({"--init", init});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "tensor " + name + " holds")) << r.output;
    EXPECT_TRUE(Contains(r.output, "at element 5")) << r.output;
  }
}
