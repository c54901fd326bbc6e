// --io-config FILE end to end (the built binary): the file `strata bench io --sweep
// --io-config FILE` writes sets the NVMe I/O of `strata train` and `strata bench step`
// (request size, queue depth, backend, O_DIRECT); --io and --io-block win over it; a bad
// file is refused naming it; a run records the file (free on resume) and its request size
// (the store's stripe, fixed on resume).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Contains;
using strata::testing::ShellQuote;

CliRun Strata(const std::string& args) {
  strata::testing::CliRunOptions options;
  options.timeout_s = 120;
  options.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  return strata::testing::RunCli(args, options);
}

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const char* kTrain =
    "train --layers 2 --d-model 32 --seq-len 16 --batch 2 --host-mem 400K --steps 3";

TEST(IoConfigCli, TheSweepsFileSetsTrainsIo) {
  strata::testing::TempDir tmp("strata-io-config");
  const std::string file = tmp.File("io.json");
  const CliRun sweep = Strata("bench io --size 8M --sweep --sweep-rounds 1 --path" +
                              ShellQuote({tmp.path()}) + " --io-config" + ShellQuote({file}));
  ASSERT_EQ(sweep.exit_code, 0) << sweep.output;
  const nlohmann::json io = nlohmann::json::parse(Read(file))["io"];
  const uint64_t block = io["block_bytes"];
  const uint32_t qd = io["queue_depth"];
  const std::string nvme = ShellQuote({tmp.File("nvme")});
  const CliRun train =
      Strata(std::string(kTrain) + " --nvme" + nvme + " --io-config" + ShellQuote({file}));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string kib = std::to_string(block >> 10) + " KiB";
  const std::string mib = std::to_string(block >> 20) + " MiB";
  EXPECT_TRUE(Contains(train.output, "requests of " + (block < (1 << 20) ? kib : mib) +
                                         ", queue depth " + std::to_string(qd) + ", " +
                                         io["backend"].get<std::string>()))
      << train.output;
  const std::string record = Read(tmp.File("nvme/strata.run.toml"));
  EXPECT_TRUE(Contains(record, "io-config = \"" + file + "\"")) << record;
  EXPECT_TRUE(Contains(record, "io-block = \"" + std::to_string(block) + "\"")) << record;

  // --resume alone reads the recorded file again and keeps the store's request size; another
  // --io-config may change the queue depth, another --io-block is refused.
  std::ofstream(tmp.File("qd2.json")) << R"({"io": {"queue_depth": 2, "block_bytes": 65536}})";
  const CliRun resumed = Strata("train --resume" + nvme + " --steps 5 --io-config" +
                                ShellQuote({tmp.File("qd2.json")}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(Contains(resumed.output, "--io-config: ")) << resumed.output;  // applied, printed
  EXPECT_TRUE(Contains(resumed.output,
                       "requests of " + (block < (1 << 20) ? kib : mib) + ", queue depth 2"))
      << resumed.output;
  const CliRun refused = Strata("train --resume" + nvme + " --steps 6 --io-block 8K");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_TRUE(Contains(refused.output, "--io-block")) << refused.output;
}

TEST(IoConfigCli, FlagsWinOverTheFileInTrainAndBenchStep) {
  strata::testing::TempDir tmp("strata-io-config");
  const std::string file = tmp.File("io.json");
  std::ofstream(file) << R"({"io": {"block_bytes": 262144, "queue_depth": 4, "backend": "uring",
                                   "direct": false}, "measured": {"rounds": 3}})";
  const std::string cfg = " --io-config" + ShellQuote({file});
  const CliRun train = Strata(std::string(kTrain) + " --nvme" + ShellQuote({tmp.File("a")}) + cfg +
                              " --json" + ShellQuote({tmp.File("a.json")}));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_TRUE(Contains(train.output, "requests of 256 KiB, queue depth 4, uring, buffered"))
      << train.output;
  const nlohmann::json js = nlohmann::json::parse(Read(tmp.File("a.json")))["config"]["nvme_io"];
  EXPECT_EQ(js["block_bytes"], 262144u) << js.dump();
  EXPECT_EQ(js["queue_depth"], 4u) << js.dump();
  EXPECT_EQ(js["direct"], false) << js.dump();
  EXPECT_EQ(js["io_config"], file) << js.dump();
  const CliRun flags = Strata(std::string(kTrain) + " --nvme" + ShellQuote({tmp.File("b")}) + cfg +
                              " --io posix --io-block 64K");
  ASSERT_EQ(flags.exit_code, 0) << flags.output;
  EXPECT_TRUE(Contains(flags.output, "requests of 64 KiB, queue depth 4, posix, buffered"))
      << flags.output;
  const CliRun step = Strata(
      "bench step --blocks 3 --block-bytes 64K --compute-ms 0 --steps 2 --device-mem unlimited "
      "--host-mem 512K --io-block 128K --nvme" +
      ShellQuote({tmp.File("c")}) + cfg);
  ASSERT_EQ(step.exit_code, 0) << step.output;
  EXPECT_TRUE(Contains(step.output, "requests of 128 KiB, queue depth 4, uring, buffered"))
      << step.output;
}

TEST(IoConfigCli, ABadFileIsNamedAndLeavesNoStore) {
  strata::testing::TempDir tmp("strata-io-config");
  const std::pair<const char*, const char*> bad[] = {
      {"{", "not a JSON object"},
      {R"({"block_bytes": 4096})", "no \"io\" object"},
      {R"({"io": {"queue_depth": 0}})", "io.queue_depth"},
      {R"({"io": {"block_bytes": 1000}})", "io.block_bytes"},
      {R"({"io": {"backend": "spdk"}})", "io.backend"},
      {R"({"io": {"qd": 4}})", "unknown setting io.qd"},
  };
  for (const auto& [text, says] : bad) {
    const std::string file = tmp.File("bad.json");
    std::ofstream(file) << text;
    for (const std::string& cmd : {std::string(kTrain), std::string("bench step --steps 1")}) {
      const CliRun r = Strata(cmd + " --nvme" + ShellQuote({tmp.File("nvme")}) + " --io-config" +
                              ShellQuote({file}));
      EXPECT_NE(r.exit_code, 0) << text << "\n" << r.output;
      EXPECT_TRUE(Contains(r.output, "--io-config " + file)) << r.output;
      EXPECT_TRUE(Contains(r.output, says)) << r.output;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.File("nvme/strata.manifest")));
  const CliRun missing =
      Strata(std::string(kTrain) + " --io-config" + ShellQuote({tmp.File("none.json")}));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(Contains(missing.output, "--io-config " + tmp.File("none.json"))) << missing.output;
}

}  // namespace
