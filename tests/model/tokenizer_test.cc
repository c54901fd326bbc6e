// The GPT-2 byte-level BPE tokenizer against a small tokenizer.json built here, whose
// encodings are worked out by hand in the comments, plus byte round trips and, when a real
// GPT-2 tokenizer.json is named by STRATA_GPT2_TOKENIZER, GPT-2's own encodings.
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>

namespace strata::model {
namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode, written as in its encoder.py: the UTF-8 text of byte b's char.
std::string ByteChar(int b) {
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  int cp = -1, n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool listed = std::find(bs.begin(), bs.end(), x) != bs.end();
    const int mapped = listed ? x : 256 + n++;
    if (x == b) cp = mapped;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Bytes are ids 0..255 (id == byte value); merges, lowest rank first:
//   0 "h e" -> he 256, 1 "Ġ t" -> Ġt 257, 2 "Ġt he" -> Ġthe 258, 3 "e r" -> er 259,
//   4 "t h" -> th 260, 5 "n '" -> n' 262, 6 "a 1" -> a1 263;  added <|endoftext|> 261.
json SmallTokenizer(bool merges_as_arrays) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::string G = ByteChar(' ');  // "Ġ"
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {G, "t"}, {G + "t", "he"}, {"e", "r"}, {"t", "h"}, {"n", "'"}, {"a", "1"}};
  const std::vector<int> ids = {256, 257, 258, 259, 260, 262, 263};
  json m = json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    vocab[merges[i].first + merges[i].second] = ids[i];
    if (merges_as_arrays) {
      m.push_back({merges[i].first, merges[i].second});
    } else {
      m.push_back(merges[i].first + " " + merges[i].second);
    }
  }
  vocab["<|endoftext|>"] = 261;
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 261}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

Tokenizer Small(bool merges_as_arrays = false) {
  auto t = Tokenizer::Parse(SmallTokenizer(merges_as_arrays).dump(), "small.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

std::vector<int32_t> Enc(const Tokenizer& t, const std::string& s) {
  auto ids = t.Encode(s);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(Tokenizer, MergesByRankWithinGpt2PreTokens) {
  for (bool arrays : {false, true}) {
    const Tokenizer t = Small(arrays);
    EXPECT_EQ(t.vocab_size(), 264);
    // "the": t h e; "h e" (rank 0) beats "t h" (rank 4), then "t he" has no merge.
    EXPECT_EQ(Enc(t, "the"), (std::vector<int32_t>{'t', 256}));
    // " the": Ġ t h e -> Ġ t he -> Ġt he -> Ġthe.
    EXPECT_EQ(Enc(t, " the"), (std::vector<int32_t>{258}));
    // " other": Ġ o t h e r -> Ġ o t he r ("he r" and "t he" are no merges).
    EXPECT_EQ(Enc(t, " other"), (std::vector<int32_t>{' ', 'o', 't', 256, 'r'}));
    // Two spaces before a word: the first alone, the second with the word; "\n" alone.
    EXPECT_EQ(Enc(t, "the other<|endoftext|> the  there\n"),
              (std::vector<int32_t>{'t', 256, ' ', 'o', 't', 256, 'r', 261, 258, ' ', 258, 'r', 'e',
                                    '\n'}));
    // "'t" is its own pre-token, so "n '" never merges; letters and digits split apart,
    // so "a 1" never merges; " 42" stays one pre-token.
    EXPECT_EQ(Enc(t, "don't"), (std::vector<int32_t>{'d', 'o', 'n', '\'', 't'}));
    EXPECT_EQ(Enc(t, "a1"), (std::vector<int32_t>{'a', '1'}));
    // "'x" is no contraction: the pre-tokens are "n", "'" (punctuation), "x".
    EXPECT_EQ(Enc(t, "n'x"), (std::vector<int32_t>{'n', '\'', 'x'}));
    // Non-ASCII letters are one pre-token with the space before them: " é" -> Ġ Ã ©.
    EXPECT_EQ(Enc(t, " \xC3\xA9"), (std::vector<int32_t>{' ', 0xC3, 0xA9}));
    EXPECT_EQ(t.Decode({'t', 256, 258, 261, 999}), "the the<|endoftext|><999>");
  }
}

TEST(Tokenizer, AnyBytesRoundTrip) {
  const Tokenizer t = Small();
  std::mt19937_64 rng(42);
  for (int len : {0, 1, 15, 17, 1023}) {
    std::string s(len, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    SCOPED_TRACE("length " + std::to_string(len) + ", seed 42");
    EXPECT_EQ(t.Decode(Enc(t, s)), s);
  }
  const std::string text = "  Hello, world!\n\n\tIt's 2024 -- the end.  ";
  EXPECT_EQ(t.Decode(Enc(t, text)), text);
}

TEST(Tokenizer, RefusesWhatItCannotRead) {
  json j = SmallTokenizer(false);
  j["model"]["type"] = "Unigram";
  auto t = Tokenizer::Parse(j.dump(), "u.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotSupported);
  j = SmallTokenizer(false);
  j["model"]["merges"].push_back("q z");  // "qz" is not in the vocabulary
  t = Tokenizer::Parse(j.dump(), "m.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().ToString().find("m.json"), std::string::npos);
  EXPECT_FALSE(Tokenizer::Parse("{", "x.json").ok());
  EXPECT_FALSE(Tokenizer::Load("/nonexistent/tokenizer.json").ok());
}

// GPT-2's own tokenizer.json (e.g. from the gpt2 model on the Hugging Face hub), when the
// environment names one.
TEST(Tokenizer, KnownGpt2Encodings) {
  const char* path = std::getenv("STRATA_GPT2_TOKENIZER");
  if (path == nullptr) GTEST_SKIP() << "set STRATA_GPT2_TOKENIZER to GPT-2's tokenizer.json";
  auto t = Tokenizer::Load(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(Enc(*t, "Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(Enc(*t, "The"), (std::vector<int32_t>{464}));
  EXPECT_EQ(Enc(*t, " the<|endoftext|>"), (std::vector<int32_t>{262, 50256}));
}

}  // namespace
}  // namespace strata::model
