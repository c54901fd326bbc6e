// Data: llm.c token files (and their validation), text files, the built-in corpus and the
// batch rule o = ((i*B + r) * T) mod (N - T - 1).
#include "model/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>

namespace strata::model {
namespace {

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-data-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { EXPECT_EQ(0, std::system(("rm -rf " + dir_).c_str())); }
  std::string dir_;
};

TEST_F(DataTest, LlmcRoundTripAndValidation) {
  std::vector<int32_t> toks = {0, 1, 65535, 300, 7};
  const std::string p = dir_ + "/t.bin";
  ASSERT_TRUE(WriteLlmcTokens(p, toks).ok());
  auto s = LoadTokens(p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tokens, toks);
  EXPECT_EQ(s->vocab, 65536);
  EXPECT_FALSE(WriteLlmcTokens(p + "x", {70000}).ok());

  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [&](const std::string& b) { std::ofstream(p, std::ios::binary) << b; };
  write(bytes.substr(0, bytes.size() - 1));  // truncated payload
  s = LoadTokens(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("header says 5 tokens"), std::string::npos)
      << s.status().ToString();
  std::string v2 = bytes;
  v2[4] = 2;  // version 2
  write(v2);
  s = LoadTokens(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("version 2"), std::string::npos);
  write(bytes.substr(0, 100));  // magic, then a header cut short
  s = LoadTokens(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(LoadTokens(dir_ + "/missing").status().code(), StatusCode::kNotFound);
}

TEST_F(DataTest, TextFileIsBytes) {
  const std::string p = dir_ + "/a.txt";
  std::ofstream(p, std::ios::binary) << "hi\xff";
  auto s = LoadTokens(p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{'h', 'i', 255}));
  EXPECT_EQ(s->vocab, 256);
}

TEST(Corpus, DeterministicEnglishLike) {
  const std::string a = GenerateCorpus(50000, 1), b = GenerateCorpus(50000, 1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, GenerateCorpus(50000, 2));
  EXPECT_EQ(a.size(), 50000u);
  std::set<char> chars(a.begin(), a.end());
  EXPECT_GT(chars.size(), 30u);  // letters, capitals, punctuation
  EXPECT_NE(a.find(". "), std::string::npos);
  EXPECT_NE(a.find('\n'), std::string::npos);
  for (char c : a) ASSERT_TRUE(c == '\n' || (c >= 32 && c < 127));
}

TEST(Batcher, FollowsTheRuleAndHoldsOutTheTail) {
  TokenStream s;
  for (int i = 0; i < 1000; ++i) s.tokens.push_back(i % 251);
  const int B = 3, T = 17;
  auto b = Batcher::Create(&s, B, T, 0.1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->train_tokens(), 900);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int64_t i : {0, 1, 5, 123456}) {
    b->TrainBatch(i, in.data(), tg.data());
    for (int r = 0; r < B; ++r) {
      const uint64_t o = ((i * B + r) * T) % (900 - T - 1);
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[r * T + t], s.tokens[o + t]);
        ASSERT_EQ(tg[r * T + t], s.tokens[o + t + 1]);
        ASSERT_LT(o + t + 1, 900u);  // never reaches the held-out tail
      }
    }
  }
  b->ValBatch(2, in.data(), tg.data());
  const uint64_t o = ((2 * B) * T) % (100 - T - 1);
  EXPECT_EQ(in[0], s.tokens[900 + o]);
  EXPECT_FALSE(Batcher::Create(&s, B, 200, 0.1).ok());  // tail too short for T=200
  EXPECT_FALSE(Batcher::Create(&s, 0, 10).ok());
}

}  // namespace
}  // namespace strata::model
