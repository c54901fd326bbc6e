// `strata verify` and `strata export` on a store whose master weights are bf16 (--master-dtype
// bf16, EngineOptions::master_format): the store is written by the engine itself (known
// weights, not a training run's), with a run record as `strata train` leaves one; verify
// checks the 2-byte master extents and names their dtype, and export widens them exactly to
// the weights the engine reads back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt2.h"
#include "model/safetensors.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tools/strata/run_record.h"

namespace strata {
namespace {

using testing::ShellQuote;

TEST(Bf16MasterStore, VerifyNamesItAndExportWidensItExactly) {
  testing::TempDir tmp("strata-bf16-master");
  const std::string nvme = tmp.File("nvme");
  std::filesystem::create_directories(nvme);
  model::Gpt2Config cfg;
  cfg.layers = 1;
  cfg.d_model = 32;
  cfg.heads = 2;
  cfg.max_seq = 16;
  const std::vector<BlockSpec> specs = model::Gpt2BlockSpecs(cfg);
  const std::string run = cli::NewRunId();
  std::map<std::string, std::vector<float>> want;
  {
    auto device = CreateHostDevice(DeviceOptions{});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EngineOptions opt;
    opt.device = device->get();
    opt.dtype = WorkingDtype::kBf16;
    opt.master_format = MasterFormat::kBf16Stochastic;
    opt.state_format = StateFormat::kInt8;
    opt.nvme_paths = {nvme};
    opt.durable = true;
    opt.run_id = cli::StoreRunId(run, 0, 1);
    auto engine = Engine::Create(specs, opt);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    Engine& e = **engine;
    for (int b = 0; b < int(specs.size()); ++b) {
      for (int t = 0; t < int(specs[b].tensors.size()); ++t) {
        std::vector<float> v(e.Layout()[b].tensors[t].numel);
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * std::sin(0.37f * float(i) + b + t);
        ASSERT_TRUE(e.WriteParams(b, t, v).ok());
        std::vector<float> got(v.size());
        ASSERT_TRUE(e.ReadParams(b, t, got).ok());
        for (size_t i = 0; i < v.size(); ++i) {
          ASSERT_EQ(got[i], Bf16ToFloat(FloatToBf16(v[i]))) << specs[b].tensors[t].name << i;
        }
        want[model::HfTensorName(specs, b, t)] = got;
      }
    }
    const Status committed = e.CommitParams();
    ASSERT_TRUE(committed.ok()) << committed.ToString();
  }
  // The record `strata train` would have left.
  int layers = cfg.layers, d_model = cfg.d_model, heads = cfg.heads, seq = cfg.max_seq,
      vocab = cfg.vocab;
  std::string state = "int8", master = "bf16";
  const std::vector<cli::Setting> settings = {{"layers", cli::OnResume::kFixed, &layers},
                                              {"d-model", cli::OnResume::kFixed, &d_model},
                                              {"heads", cli::OnResume::kFixed, &heads},
                                              {"seq-len", cli::OnResume::kFixed, &seq},
                                              {"vocab", cli::OnResume::kFixed, &vocab},
                                              {"state-dtype", cli::OnResume::kFixed, &state},
                                              {"master-dtype", cli::OnResume::kFixed, &master}};
  cli::RunIdentity id;
  id.run_id = run;
  ASSERT_TRUE(cli::WriteRunRecord(nvme, cli::RunRecordText(settings, id)).ok());

  testing::CliRunOptions quiet;
  quiet.stderr_to = testing::CliStderr::kDiscarded;
  const auto v = testing::RunCli("verify" + ShellQuote({nvme, "--json", "-"}), quiet);
  ASSERT_EQ(v.exit_code, 0) << v.output;
  const auto j = nlohmann::json::parse(v.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << v.output;
  EXPECT_EQ(j["dtypes"]["master"], "bf16") << v.output;

  const std::string out = tmp.File("w.safetensors");
  const auto x = testing::RunCli("export" + ShellQuote({nvme, "--out", out}));
  ASSERT_EQ(x.exit_code, 0) << x.output;
  auto reader = model::SafetensorsReader::Open(out);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->tensors().size(), want.size());
  for (const auto& [name, values] : want) {
    const model::TensorEntry* entry = reader->Find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->dtype, "F32") << name;
    std::vector<float> got(values.size());
    ASSERT_TRUE(reader->ReadFloat(name, entry->shape, got.data(), got.size()).ok()) << name;
    EXPECT_EQ(std::memcmp(got.data(), values.data(), got.size() * 4), 0) << name;
  }
}

}  // namespace
}  // namespace strata
