// safetensors: round trip, fp16/bf16 conversion, and every malformed-file error by message.
#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace strata::model {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-st-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { EXPECT_EQ(0, std::system(("rm -rf " + dir_).c_str())); }
  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
    std::ofstream f(path, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << header << data;
  }
  std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTripIsExactAndDeterministic) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> a(3 * 17), b(1), c;  // odd sizes, a scalar-like and an empty tensor
  for (float& x : a) x = nd(rng);
  b[0] = -0.0f;
  std::vector<TensorToWrite> ts = {{"h.0.attn.c_attn.weight", {3, 17}, a.data()},
                                   {"ln_f.bias", {1}, b.data()},
                                   {"empty", {0, 4}, c.data()}};
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"), ts).ok());
  ASSERT_TRUE(WriteSafetensors(Path("b.safetensors"), ts).ok());
  EXPECT_EQ(ReadAll(Path("a.safetensors")), ReadAll(Path("b.safetensors")));
  auto r = SafetensorsReader::Open(Path("a.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors().size(), 3u);
  std::vector<float> back(a.size());
  ASSERT_TRUE(r->ReadFloat("h.0.attn.c_attn.weight", {3, 17}, back.data(), back.size()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), a.data(), a.size() * 4));
  float z = 1;
  ASSERT_TRUE(r->ReadFloat("ln_f.bias", {1}, &z, 1).ok());
  EXPECT_TRUE(std::signbit(z));
  EXPECT_TRUE(r->ReadFloat("empty", {0, 4}, nullptr, 0).ok());
  // The data section is 8-byte aligned.
  const std::string bytes = ReadAll(Path("a.safetensors"));
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + hl) % 8, 0u);
}

TEST_F(SafetensorsTest, ReadsBf16AndF16) {
  // 1.0, -2.0, 0.5 in bf16 (0x3f80, 0xc000, 0x3f00) and f16 (0x3c00, 0xc000, 0x3800),
  // plus the f16 subnormal 0x0001 = 2^-24.
  const std::string bf("\x80\x3f\x00\xc0\x00\x3f", 6);
  const std::string hf("\x00\x3c\x00\xc0\x00\x38\x01\x00", 8);
  WriteRaw(Path("h.safetensors"),
           R"({"x":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
           R"("y":{"dtype":"F16","shape":[2,2],"data_offsets":[6,14]},"__metadata__":{"a":"b"}})",
           bf + hf);
  auto r = SafetensorsReader::Open(Path("h.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  float x[3], y[4];
  ASSERT_TRUE(r->ReadFloat("x", {3}, x, 3).ok());
  ASSERT_TRUE(r->ReadFloat("y", {2, 2}, y, 4).ok());
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -2.0f);
  EXPECT_EQ(x[2], 0.5f);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_EQ(y[3], std::ldexp(1.0f, -24));
}

struct BadCase {
  const char* what;
  std::string header;
  std::string data;
  const char* expect;  // substring of the error message
};

TEST_F(SafetensorsTest, MalformedFilesNameTheProblem) {
  const std::vector<BadCase> cases = {
      {"not json", "{oops", "", "not a JSON object"},
      {"array header", "[1,2]", "", "not a JSON object"},
      {"missing dtype", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "xxxx", "tensor w"},
      {"bad offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "xxxx",
       "outside the data section"},
      {"size mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,4]}})", "xxxx",
       "needs 12 bytes"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx",
       "non-negative"},
      {"unknown dtype", R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", "xxxx",
       "unknown dtype"},
      {"overlapping tensors",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, 'x'), "tensors a and b overlap"},
      {"same range twice",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "xxxx", "overlap"},
      {"hole between tensors",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       std::string(12, 'x'), "bytes 4 to 8 of the data section belong to no tensor"},
      {"trailing bytes", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       std::string(12, 'x'), "last 8 bytes of the data section belong to no tensor"},
      {"shape overflows 64 bits",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", "",
       "more bytes than 64 bits"},
  };
  for (const BadCase& c : cases) {
    WriteRaw(Path("bad.safetensors"), c.header, c.data);
    auto r = SafetensorsReader::Open(Path("bad.safetensors"));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << c.what;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(Path("bad.safetensors")), std::string::npos);
  }
}

TEST_F(SafetensorsTest, TruncatedFiles) {
  std::vector<float> a(100, 1.0f);
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {{"wte.weight", {10, 10}, a.data()}}).ok());
  const std::string full = ReadAll(Path("t.safetensors"));
  for (size_t cut : {size_t{0}, size_t{5}, size_t{20}, full.size() - 1}) {
    std::ofstream(Path("cut.safetensors"), std::ios::binary) << full.substr(0, cut);
    auto r = SafetensorsReader::Open(Path("cut.safetensors"));
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  }
  auto missing = SafetensorsReader::Open(Path("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, MissingTensorAndWrongShape) {
  std::vector<float> a(6, 1.0f);
  ASSERT_TRUE(WriteSafetensors(Path("s.safetensors"), {{"wpe.weight", {2, 3}, a.data()}}).ok());
  auto r = SafetensorsReader::Open(Path("s.safetensors"));
  ASSERT_TRUE(r.ok());
  std::vector<float> out(6);
  Status s = r->ReadFloat("wte.weight", {2, 3}, out.data(), 6);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("wte.weight"), std::string::npos) << s.ToString();
  s = r->ReadFloat("wpe.weight", {3, 2}, out.data(), 6);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("has shape [2, 3], expected [3, 2]"), std::string::npos)
      << s.ToString();
}

TEST_F(SafetensorsTest, DuplicateNamesRejected) {
  float x = 1;
  Status s = WriteSafetensors(Path("d.safetensors"), {{"a", {1}, &x}, {"a", {1}, &x}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::model
