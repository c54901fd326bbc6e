// Tests of `strata generate` through the built binary (STRATA_CLI_PATH), on
// a small GPT-2 written here (model/gpt2's initialisation, scaled so that its predictions are
// far from uniform) and a small byte-level BPE tokenizer.json.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt2.h"
#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::Contains;
using testing::ShellQuote;

struct TinyModel {
  model::Gpt2Config cfg;
  model::HostWeights w;
};

TinyModel WriteModel(const std::string& path, int vocab) {
  TinyModel m;
  m.cfg.layers = 1;
  m.cfg.d_model = 16;
  m.cfg.heads = 2;
  m.cfg.max_seq = 8;
  m.cfg.vocab = vocab;
  const auto specs = model::Gpt2BlockSpecs(m.cfg);
  m.w.layouts = model::PlainLayout(specs, 1);
  for (size_t b = 0; b < specs.size(); ++b) {
    m.w.blocks.emplace_back(m.w.layouts[b].padded_numel);
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      const TensorLayout& tl = m.w.layouts[b].tensors[t];
      std::span<float> out(m.w.blocks[b].data() + tl.offset, tl.numel);
      model::InitTensor(m.cfg, specs, static_cast<int>(b), static_cast<int>(t), 3, out);
      if (specs[b].tensors[t].shape.size() == 2) {
        for (float& x : out) x *= 20;
      }
    }
  }
  EXPECT_TRUE(model::SaveWeights(path, specs, m.w).ok());
  return m;
}

// Bytes as ids 0..255 (GPT-2's printable stand-ins) and one merge, "Ġ t" -> "Ġt" (256).
void WriteTokenizer(const std::string& path) {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  vocab["\xC4\xA0t"] = 256;  // "Ġt"
  nlohmann::json j = {{"pre_tokenizer", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\xC4\xA0 t"}}}}};
  std::ofstream(path) << j.dump();
}

CliRun Strata(const std::string& args) {
  testing::CliRunOptions options;
  options.stderr_to = testing::CliStderr::kDiscarded;
  return testing::RunCli(args, options);
}

TEST(GenerateCli, TopK1IsGreedyAndSeedsRepeat) {
  testing::TempDir tmp;
  WriteModel(tmp.File("m.safetensors"), 256);
  const std::string base = "generate --init " + tmp.File("m.safetensors") + " --tokens 12";
  const CliRun greedy = Strata(base);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  EXPECT_EQ(greedy.output.rfind("The ", 0), 0u) << greedy.output;
  const CliRun top1 = Strata(base + " --temperature 2 --top-k 1 --seed 9");
  EXPECT_EQ(top1.output, greedy.output);
  const CliRun a = Strata(base + " --temperature 1 --top-p 0.9 --seed 5");
  const CliRun b = Strata(base + " --temperature 1 --top-p 0.9 --seed 5");
  ASSERT_EQ(a.exit_code, 0);
  EXPECT_EQ(a.output, b.output);
  testing::CliRunOptions merged;
  const CliRun bad = testing::RunCli(base + " --top-p 0", merged);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(Contains(bad.output, "--top-p")) << bad.output;
}

TEST(GenerateCli, TokenizerEncodesThePromptAndDecodesTheOutput) {
  testing::TempDir tmp;
  WriteModel(tmp.File("m.safetensors"), 257);
  WriteTokenizer(tmp.File("tokenizer.json"));
  const CliRun r =
      Strata("generate --init " + tmp.File("m.safetensors") + " --tokenizer " +
             tmp.File("tokenizer.json") + " --tokens 10 --prompt" + ShellQuote({"a tale"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("a tale", 0), 0u) << r.output;
  EXPECT_FALSE(Contains(r.output, "<256>")) << "token 256 must decode to \" t\": " << r.output;
  // A tokenizer larger than the model's vocabulary is refused.
  WriteModel(tmp.File("small.safetensors"), 256);
  testing::CliRunOptions merged;
  const CliRun bad = testing::RunCli("generate --init " + tmp.File("small.safetensors") +
                                         " --tokenizer " + tmp.File("tokenizer.json"),
                                     merged);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(Contains(bad.output, "--tokenizer")) << bad.output;
}

}  // namespace
}  // namespace strata
