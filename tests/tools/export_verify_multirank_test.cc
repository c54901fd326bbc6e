// `strata export` and `strata verify` on the stores real `strata train` runs leave (1 and 2
// ranks): export gives the bytes `--save` gives for the same step; verify passes a whole store,
// changes nothing, and finds each kind of damage (a flipped bit in any extent, a truncated or
// missing rank file, an edited manifest or record), naming the file and offset; export refuses
// a damaged store and writes nothing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "strata/optim.h"
#include "strata/store_reader.h"
#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

namespace fs = std::filesystem;
using strata::testing::Contains;
using strata::testing::RunCli;
using strata::testing::ShellQuote;

const std::vector<std::string> kRankVars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                            "STRATA_RENDEZVOUS"};

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A short run of `ranks` ranks with its stores under nvme (a {rank} pattern) and --save.
strata::testing::CliRun Train(int ranks, const std::string& nvme, const std::string& save,
                              const std::string& extra = "") {
  const std::string train = std::string(STRATA_CLI_PATH) +
                            " train --layers 2 --d-model 64 --heads 2 --seq-len 16 --batch 4 "
                            "--steps 3 --threads 1 " +
                            extra + " --nvme" + ShellQuote({nvme, "--save", save});
  const std::string cmd = ranks == 1 ? train.substr(std::string(STRATA_CLI_PATH).size() + 1)
                                     : "launch -n " + std::to_string(ranks) + " -- " + train;
  strata::testing::CliRunOptions options;
  options.unset_env = kRankVars;
  return RunCli(cmd, options);
}

// Every file under `dir`: its bytes and modification time (ns).
std::map<std::string, std::pair<std::string, int64_t>> Snapshot(const std::string& dir) {
  std::map<std::string, std::pair<std::string, int64_t>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    struct stat st {};
    ::stat(e.path().c_str(), &st);
    out[e.path().string()] = {Slurp(e.path().string()),
                              int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
  return out;
}

nlohmann::json VerifyJson(const std::string& dir, int* exit_code) {
  strata::testing::CliRunOptions quiet;
  quiet.stderr_to = strata::testing::CliStderr::kDiscarded;
  auto r = RunCli("verify" + ShellQuote({dir, "--json", "-"}), quiet);
  *exit_code = r.exit_code;
  return nlohmann::json::parse(r.output, nullptr, false);
}

class ExportVerify : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ranks_ = GetParam();
    pattern_ = tmp_.File("nvme/{rank}");
    auto r = Train(ranks_, pattern_, tmp_.File("saved.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string Rank(int r) const { return tmp_.File("nvme/" + std::to_string(r)); }
  // A copy of the stores, to damage.
  std::string Copy(const std::string& name) const {
    const std::string to = tmp_.File(name);
    fs::copy(tmp_.File("nvme"), to, fs::copy_options::recursive);
    return to + "/{rank}";
  }

  strata::testing::TempDir tmp_{"strata-export-verify"};
  int ranks_ = 1;
  std::string pattern_;
};

TEST_P(ExportVerify, ExportEqualsSaveBitForBitAndVerifyChangesNothing) {
  const auto before = Snapshot(tmp_.File("nvme"));
  auto v = RunCli("verify" + ShellQuote({pattern_}));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_TRUE(Contains(v.output, "ok: every record, manifest and extent is whole")) << v.output;
  auto e = RunCli("export" +
                  ShellQuote({pattern_, "--out", tmp_.File("x.safetensors"), "--with-optimizer"}));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_EQ(Slurp(tmp_.File("x.safetensors")), Slurp(tmp_.File("saved.safetensors")));
  // One rank's folder names the run as well as the pattern does.
  auto one = RunCli("export" + ShellQuote({Rank(ranks_ - 1), "--out", tmp_.File("y.safetensors")}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(Slurp(tmp_.File("y.safetensors")), Slurp(tmp_.File("saved.safetensors")));
  int code = -1;
  nlohmann::json j = VerifyJson(Rank(0), &code);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(code, 0);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["world_size"], ranks_);
  EXPECT_EQ(j["model"]["layers"], 2);
  EXPECT_EQ(j["model"]["d_model"], 64);
  EXPECT_EQ(j["dtypes"]["exp_avg"], "fp32");
  EXPECT_EQ(j["ranks"].size(), size_t(ranks_));
  EXPECT_GT(j["read"]["bytes"].get<uint64_t>(), 0u);
  // Neither command wrote to, or touched the times of, any file of the store.
  EXPECT_TRUE(before == Snapshot(tmp_.File("nvme")));

  // The moments' file has every tensor of the weights', and they are not the weights.
  auto w = strata::model::SafetensorsReader::Open(tmp_.File("x.safetensors"));
  auto m = strata::model::SafetensorsReader::Open(tmp_.File("x.exp_avg.safetensors"));
  ASSERT_TRUE(w.ok() && m.ok());
  ASSERT_EQ(w->tensors().size(), m->tensors().size());
  EXPECT_EQ(m->metadata().at("step"), "3");
}

// Int8 moments: verify checks their extents (codes and scales, strata/state_layout.h) and
// names the format; export --with-optimizer dequantizes them, per rank's runs, to values near
// the fp32 run's moments (the same data, steps and seed).
TEST_P(ExportVerify, Int8MomentsVerifyAndExportDequantized) {
  const std::string nvme8 = tmp_.File("nvme8/{rank}");
  auto r = Train(ranks_, nvme8, tmp_.File("saved8.safetensors"), "--state-dtype int8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int code = -1;
  nlohmann::json j = VerifyJson(nvme8, &code);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(code, 0) << j.dump();
  EXPECT_EQ(j["dtypes"]["exp_avg"], "int8");
  auto e = RunCli("export" +
                  ShellQuote({nvme8, "--out", tmp_.File("x8.safetensors"), "--with-optimizer"}));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto f = RunCli("export" +
                  ShellQuote({pattern_, "--out", tmp_.File("x.safetensors"), "--with-optimizer"}));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  for (const char* k : {"exp_avg", "exp_avg_sq"}) {
    SCOPED_TRACE(k);
    auto a =
        strata::model::SafetensorsReader::Open(tmp_.File(std::string("x8.") + k + ".safetensors"));
    auto b =
        strata::model::SafetensorsReader::Open(tmp_.File(std::string("x.") + k + ".safetensors"));
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    double num = 0, den = 0;
    for (const auto& [name, t] : b->tensors()) {
      const size_t n = size_t(t.NumElements());
      std::vector<float> x(n), y(n);
      ASSERT_TRUE(a->ReadFloat(name, t.shape, x.data(), n).ok()) << name;
      ASSERT_TRUE(b->ReadFloat(name, t.shape, y.data(), n).ok()) << name;
      for (size_t i = 0; i < n; ++i) {
        if (k[std::strlen(k) - 1] == 'q') {
          ASSERT_GE(x[i], 0.f) << name;
        }
        num += std::abs(double(x[i]) - y[i]);
        den += std::abs(double(y[i]));
      }
    }
    EXPECT_GT(den, 0);
    EXPECT_LT(num, 0.25 * den);  // the same moments, quantized (and a slightly other run)
  }
}

TEST_P(ExportVerify, Bf16AndHuggingFaceShardsHoldTheSameWeights) {
  auto e = RunCli("export" + ShellQuote({pattern_, "--out", tmp_.File("hf"), "--dtype", "bf16",
                                         "--max-shard-size", "64K"}));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto index = nlohmann::json::parse(Slurp(tmp_.File("hf/model.safetensors.index.json")));
  auto config = nlohmann::json::parse(Slurp(tmp_.File("hf/config.json")));
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_head"], 2);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  auto saved = strata::model::SafetensorsReader::Open(tmp_.File("saved.safetensors"));
  ASSERT_TRUE(saved.ok());
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GT(shards.size(), 1u);
  size_t tensors = 0;
  for (const std::string& file : shards) {
    auto shard = strata::model::SafetensorsReader::Open(tmp_.File("hf/" + file));
    ASSERT_TRUE(shard.ok()) << shard.status().ToString();
    for (const auto& [name, t] : shard->tensors()) {
      ++tensors;
      EXPECT_EQ(t.dtype, "BF16");
      ASSERT_EQ(name.rfind("transformer.", 0), 0u) << name;
      const std::string plain = name.substr(12);
      const auto* s = saved->Find(plain);
      ASSERT_NE(s, nullptr) << plain;
      std::vector<float> want(size_t(s->NumElements())), got(want.size());
      ASSERT_TRUE(saved->ReadFloat(plain, s->shape, want.data(), want.size()).ok());
      ASSERT_TRUE(shard->ReadFloat(name, s->shape, got.data(), got.size()).ok());
      for (size_t i = 0; i < want.size(); ++i) {
        const uint32_t bits = uint32_t(strata::FloatToBf16(want[i])) << 16;
        float rounded;
        std::memcpy(&rounded, &bits, 4);
        ASSERT_EQ(got[i], rounded) << name << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(tensors, saved->tensors().size());
}

// Flips one bit in the middle of every extent of every rank, one at a time: verify names the
// extent's file and offset each time and fails; export refuses and leaves nothing.
TEST_P(ExportVerify, VerifyFindsAFlippedBitInEveryExtent) {
  const std::string damaged = Copy("flip");
  std::mt19937_64 rng(testing::UnitTest::GetInstance()->random_seed());
  int checked = 0;  // exports of a damaged master extent
  for (int r = 0; r < ranks_; ++r) {
    const std::string folder = tmp_.File("flip/" + std::to_string(r));
    std::vector<strata::StoreExtentInfo> extents;
    {
      auto reader = strata::StoreReader::Open({folder});
      ASSERT_TRUE(reader.ok()) << reader.status().ToString();
      extents = (*reader)->extents();
    }
    ASSERT_GE(extents.size(), 12u);
    for (const strata::StoreExtentInfo& e : extents) {
      const std::string clean = Slurp(e.file);
      std::string bytes = clean;
      const uint64_t at = e.file_offset + rng() % e.length;
      bytes[at] = char(bytes[at] ^ (1 << (rng() % 8)));
      Spit(e.file, bytes);
      int code = -1;
      nlohmann::json j = VerifyJson(damaged, &code);
      EXPECT_EQ(code, 1) << e.key;
      ASSERT_EQ(j["problems"].size(), 1u) << j.dump(2);
      EXPECT_EQ(j["problems"][0]["path"], e.file);
      EXPECT_EQ(j["problems"][0]["offset"], e.file_offset);
      EXPECT_TRUE(Contains(j["problems"][0]["message"], e.key + " ")) << j.dump(2);
      // Export reads the master weights (the moments only --with-optimizer).
      if (e.key.ends_with(".master") && checked++ == 0) {
        auto x = RunCli("export" + ShellQuote({damaged, "--out", tmp_.File("bad.safetensors")}));
        EXPECT_NE(x.exit_code, 0);
        EXPECT_TRUE(Contains(x.output, "fails its checksum")) << x.output;
        EXPECT_FALSE(fs::exists(tmp_.File("bad.safetensors")));
      }
      Spit(e.file, clean);
    }
  }
  EXPECT_EQ(checked, ranks_ * 4);  // embed, 2 layers, ln_f per rank
  int code = -1;
  VerifyJson(damaged, &code);
  EXPECT_EQ(code, 0);  // every bit put back: whole again
}

TEST_P(ExportVerify, VerifyFindsTruncatedAndMissingRankFilesAndEditedManifestsAndRecords) {
  const int last = ranks_ - 1;
  const std::string data = "/" + std::to_string(last) + "/strata.swap.0-of-1";
  struct Case {
    std::string name;
    std::function<void(const std::string& root)> damage;
    std::string path;  // the file the problem names, under root
    std::string says;
  };
  const std::vector<Case> cases = {
      {"truncated",
       [&](const std::string& root) {
         auto reader = strata::StoreReader::Open({root + "/" + std::to_string(last)});
         ASSERT_TRUE(reader.ok());
         const uint64_t end = (*reader)->data_files()[0].needed_end;
         reader->reset();
         ASSERT_EQ(::truncate((root + data).c_str(), off_t(end - 4096)), 0);
       },
       data, "truncated"},
      {"missing", [&](const std::string& root) { fs::remove(root + data); }, data, "missing"},
      {"manifest",
       [&](const std::string& root) {
         const std::string p = root + "/" + std::to_string(last) + "/strata.manifest";
         std::string b = Slurp(p);
         b[b.size() / 2] ^= 4;
         Spit(p, b);
       },
       "/" + std::to_string(last) + "/strata.manifest", "checksum mismatch"},
      {"record",
       [&](const std::string& root) {
         const std::string p = root + "/" + std::to_string(last) + "/strata.run.toml";
         std::string b = Slurp(p);
         const size_t at = b.find("lr = 0.001");
         ASSERT_NE(at, std::string::npos);
         b.replace(at, 10, "lr = 0.002");
         Spit(p, b);
       },
       "/" + std::to_string(last) + "/strata.run.toml", "strata.run.toml"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string root = tmp_.File(c.name);
    const std::string pattern = Copy(c.name);
    c.damage(root);
    int code = -1;
    nlohmann::json j = VerifyJson(pattern, &code);
    EXPECT_EQ(code, 1);
    ASSERT_FALSE(j.is_discarded());
    ASSERT_GE(j["problems"].size(), 1u);
    bool named = false;
    for (const auto& p : j["problems"]) {
      named = named || (p.value("path", "") == root + c.path &&
                        Contains(p["message"].get<std::string>(), c.says));
    }
    EXPECT_TRUE(named) << j["problems"].dump(2);
    if (c.name == "truncated") {  // the extents past the end are named with their offsets
      bool offset = false;
      for (const auto& p : j["problems"]) offset = offset || p.contains("offset");
      EXPECT_TRUE(offset) << j["problems"].dump(2);
    }
    auto x = RunCli("export" + ShellQuote({pattern, "--out", root + "/out.safetensors"}));
    EXPECT_NE(x.exit_code, 0) << x.output;
    EXPECT_FALSE(fs::exists(root + "/out.safetensors"));
  }
  if (ranks_ > 1) {  // a whole rank's folder gone
    const std::string pattern = Copy("gone");
    fs::remove_all(tmp_.File("gone/" + std::to_string(last)));
    int code = -1;
    nlohmann::json j = VerifyJson(pattern, &code);
    EXPECT_EQ(code, 1);
    EXPECT_TRUE(Contains(j["problems"].dump(), "rank " + std::to_string(last))) << j.dump(2);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ExportVerify, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "rank"; });

}  // namespace

namespace {

// A run that stopped after its initial commit (step 0) holds the weights and no moments
// (never updated, they are zeros): whole, and verify says so; export writes its weights.
TEST(ExportVerifyInitialCommit, AStepZeroStoreIsWhole) {
  strata::testing::TempDir tmp("strata-export-verify0");
  const std::string nvme = tmp.File("nvme/{rank}");
  strata::testing::CliRunOptions one_launch;
  one_launch.unset_env = kRankVars;
  auto r = strata::testing::RunCli(
      "launch -n 2 -- " + std::string(STRATA_CLI_PATH) +
          " train --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 4 --steps 0 --nvme" +
          ShellQuote({nvme}),
      one_launch);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto v = RunCli("verify" + ShellQuote({nvme}));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  auto e = RunCli("export" + ShellQuote({nvme, "--out", tmp.File("w.safetensors")}));
  EXPECT_EQ(e.exit_code, 0) << e.output;
}

}  // namespace
