// Tests of `strata generate` and `strata eval` through the built binary (STRATA_CLI_PATH), on
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
#include "tests/tools/tokenizer_json.h"

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
  strata::testing::WriteByteLevelTokenizer(path, {{"\xC4\xA0 t", "\xC4\xA0t"}});
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
  // Before, a negative count printed the prompt and a NaN temperature sampled garbage.
  for (const std::string& flag : {std::string("--tokens -3"), std::string("--temperature nan"),
                                  std::string("--temperature -1")}) {
    const CliRun refused = testing::RunCli(base + " " + flag, merged);
    EXPECT_NE(refused.exit_code, 0) << flag << "\n" << refused.output;
    EXPECT_TRUE(Contains(refused.output, flag.substr(0, flag.find(' ')))) << refused.output;
  }
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

// eval --seq-len 1 predicts each held-out token from the one before it: the mean of those
// losses, computed here one token at a time, must be what eval reports.
TEST(EvalCli, ScoresEveryHeldOutTokenOnce) {
  testing::TempDir tmp;
  const TinyModel m = WriteModel(tmp.File("m.safetensors"), 256);
  std::string text;
  for (int i = 0; text.size() < 500; ++i)
    text += "to the line " + std::to_string(i * 37 % 101) + "\n";
  std::ofstream(tmp.File("data.txt")) << text;
  const size_t begin = text.size() - static_cast<size_t>(text.size() * 0.1);
  double nats = 0;
  model::Gpt2Model<float> one(m.cfg, 1, 1, false);
  for (size_t i = begin; i + 1 < text.size(); ++i) {
    const int32_t in = static_cast<unsigned char>(text[i]);
    const int32_t tg = static_cast<unsigned char>(text[i + 1]);
    nats += model::ForwardPlain(one, m.w.layouts, m.w.Ptrs(), &in, &tg);
  }
  const int64_t n = static_cast<int64_t>(text.size() - begin - 1);
  for (const std::string seq : {"1", "3", "8"}) {
    const std::string args = "eval --init " + tmp.File("m.safetensors") + " --data " +
                             tmp.File("data.txt") + " --seq-len " + seq + " --batch 2";
    const CliRun r = Strata(args + " --json -");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["tokens"].get<int64_t>(), n) << "seq-len " << seq;
    EXPECT_EQ(j["bytes"].get<int64_t>(), n);
    const double loss = j["loss"].get<double>();
    EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
    EXPECT_NEAR(j["bits_per_byte"].get<double>(), loss / std::log(2.0), 1e-9);
    if (seq == "1") {
      EXPECT_NEAR(loss, nats / n, 1e-5);
    }
    // The same figures on the report's line.
    const CliRun human = Strata(args);
    EXPECT_TRUE(Contains(human.output, "tokens " + std::to_string(n))) << human.output;
  }
  // With the tokenizer, bytes are the decoded length of the predicted tokens, fewer tokens.
  WriteModel(tmp.File("m257.safetensors"), 257);
  WriteTokenizer(tmp.File("tokenizer.json"));
  const CliRun t =
      Strata("eval --init " + tmp.File("m257.safetensors") + " --data " + tmp.File("data.txt") +
             " --tokenizer " + tmp.File("tokenizer.json") + " --json " + tmp.File("e.json"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  nlohmann::json j;
  std::ifstream(tmp.File("e.json")) >> j;
  EXPECT_GT(j["bytes"].get<int64_t>(), j["tokens"].get<int64_t>());
}

}  // namespace
}  // namespace strata
