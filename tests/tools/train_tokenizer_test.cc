// `strata train --tokenizer` end to end (the built binary): a text --data is encoded through
// a Hugging Face tokenizer.json written here, the model's vocabulary is the tokenizer's, the
// run records the tokenizer (fixed on resume), and the saved model is evaluated and
// prompted through the same tokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tests/tools/tokenizer_json.h"

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

// Bytes as ids 0..255 (GPT-2's printable stand-ins) and three merges: "Ġ t" -> "Ġt" (256),
// "h e" -> "he" (257), "Ġt he" -> "Ġthe" (258): 259 tokens.
void WriteTokenizer(const std::string& path) {
  strata::testing::WriteByteLevelTokenizer(
      path, {{"\xC4\xA0 t", "\xC4\xA0t"}, {"h e", "he"}, {"\xC4\xA0t he", "\xC4\xA0the"}});
}

void WriteText(const std::string& path) {
  std::ofstream f(path);
  for (int i = 0; i < 400; ++i) f << "the cat and the hen sat on the mat; then the hen ate.\n";
}

TEST(TrainTokenizerCli, TrainsOnTokensAndEvalAndGenerateUseTheSameTokenizer) {
  strata::testing::TempDir tmp("strata-train-tok");
  WriteTokenizer(tmp.File("tokenizer.json"));
  WriteText(tmp.File("data.txt"));
  const std::string tok = ShellQuote({tmp.File("tokenizer.json")});
  const std::string data = ShellQuote({tmp.File("data.txt")});
  const std::string base =
      "train --layers 1 --d-model 32 --seq-len 16 --batch 2 --data" + data + " --tokenizer" + tok;

  const CliRun printed = Strata(base + " --print-config");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_TRUE(Contains(printed.output, "\nvocab = 259\n")) << printed.output;
  EXPECT_TRUE(Contains(printed.output, "\ntokenizer = \"" + tmp.File("tokenizer.json") + "\"\n"))
      << printed.output;

  const std::string nvme = ShellQuote({tmp.File("nvme")});
  const CliRun trained = Strata(base + " --steps 30 --lr 1e-2 --sample 8 --nvme" + nvme +
                                " --save" + ShellQuote({tmp.File("m.safetensors")}) + " --json" +
                                ShellQuote({tmp.File("t.json")}));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // 400 lines of 54 bytes; " the" is one token, so there are fewer tokens than bytes.
  EXPECT_TRUE(Contains(trained.output, "vocab 259")) << trained.output;
  EXPECT_TRUE(Contains(trained.output, "(21600 bytes, ")) << trained.output;
  EXPECT_FALSE(Contains(trained.output, "21600 tokens")) << trained.output;
  EXPECT_TRUE(Contains(trained.output, "sample: The ")) << trained.output;
  EXPECT_FALSE(Contains(trained.output, "<25")) << "ids above 255 are decoded\n" << trained.output;

  // The tokenizer is part of the run: --resume alone uses it; a copy of it elsewhere is the
  // same tokenizer; another one, or the same file changed, is refused (its content is
  // recorded, as --data's is).
  const CliRun resumed = Strata("train --resume" + nvme + " --steps 32");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(Contains(resumed.output, "vocab 259")) << resumed.output;
  WriteTokenizer(tmp.File("copy.json"));
  const CliRun copied = Strata("train --resume" + nvme + " --steps 33 --tokenizer" +
                               ShellQuote({tmp.File("copy.json")}));
  ASSERT_EQ(copied.exit_code, 0) << copied.output;
  EXPECT_TRUE(Contains(copied.output, "copy.json\" (the same content)")) << copied.output;
  // Three merges too (259 tokens), but other ones.
  const std::vector<std::pair<std::string, std::string>> other_merges = {
      {"h e", "he"}, {"a t", "at"}, {"\xC4\xA0 t", "\xC4\xA0t"}};
  strata::testing::WriteByteLevelTokenizer(tmp.File("other.json"), other_merges);
  const CliRun other = Strata("train --resume" + nvme + " --steps 34 --tokenizer" +
                              ShellQuote({tmp.File("other.json")}));
  EXPECT_NE(other.exit_code, 0) << other.output;
  EXPECT_TRUE(Contains(other.output, "--tokenizer: \"")) << other.output;
  // The resume with the copy recorded the copy's path, so the run's tokenizer is now
  // copy.json: change that file's content and resume with --resume alone.
  strata::testing::WriteByteLevelTokenizer(tmp.File("copy.json"), other_merges);
  const CliRun changed = Strata("train --resume" + nvme + " --steps 34");
  EXPECT_NE(changed.exit_code, 0) << changed.output;
  EXPECT_TRUE(Contains(changed.output, "--tokenizer file content")) << changed.output;
  EXPECT_TRUE(Contains(changed.output, "the file changed since the run started")) << changed.output;

  const std::string init = " --init" + ShellQuote({tmp.File("m.safetensors")});
  const CliRun eval = Strata("eval" + init + " --data" + data + " --tokenizer" + tok);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(Contains(eval.output, "bits/byte")) << eval.output;
  const CliRun gen = Strata("generate" + init + " --tokenizer" + tok + " --tokens 12 --prompt" +
                            ShellQuote({"the hen"}));
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_EQ(gen.output.rfind("the hen", 0), 0u) << gen.output;
  EXPECT_FALSE(Contains(gen.output, "<25")) << gen.output;
}

TEST(TrainTokenizerCli, BadTokenizerOrSmallVocabIsNamed) {
  strata::testing::TempDir tmp("strata-train-tok");
  WriteTokenizer(tmp.File("tokenizer.json"));
  std::ofstream(tmp.File("broken.json")) << "{";
  const CliRun missing = Strata("train --steps 1 --tokenizer" + ShellQuote({tmp.File("no.json")}));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(Contains(missing.output, "--tokenizer")) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "no.json")) << missing.output;
  const CliRun broken =
      Strata("train --steps 1 --tokenizer" + ShellQuote({tmp.File("broken.json")}));
  EXPECT_NE(broken.exit_code, 0);
  EXPECT_TRUE(Contains(broken.output, "broken.json")) << broken.output;
  const CliRun small = Strata("train --steps 1 --layers 1 --d-model 32 --vocab 200 --tokenizer" +
                              ShellQuote({tmp.File("tokenizer.json")}));
  EXPECT_NE(small.exit_code, 0);
  EXPECT_TRUE(Contains(small.output, "--tokenizer")) << small.output;
  EXPECT_TRUE(Contains(small.output, "259 tokens")) << small.output;
}

}  // namespace
