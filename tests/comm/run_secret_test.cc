// HMAC-SHA256 against RFC 4231's test vectors, the run secrets `strata launch` makes, and
// reading one from --run-secret-file.
#include "comm/run_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "tests/temp_dir.h"

namespace strata {
namespace {

std::string Hex(const HmacSha256Digest& d) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

// RFC 4231 section 4: test cases 1-4, 6 and 7 (5 truncates the output).
TEST(HmacSha256, MatchesRfc4231) {
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(Hex(HmacSha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  const std::string big_key(131, '\xaa');
  EXPECT_EQ(Hex(HmacSha256(big_key, "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(Hex(HmacSha256(big_key,
                           "This is a test using a larger than block-size key and a larger than "
                           "block-size data. The key needs to be hashed before being used by the "
                           "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, EmptyInputsAndComparison) {
  // Python: hmac.new(b"", b"", hashlib.sha256).hexdigest()
  EXPECT_EQ(Hex(HmacSha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  const HmacSha256Digest a = HmacSha256("k", "v");
  HmacSha256Digest b = a;
  EXPECT_TRUE(DigestsEqual(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(DigestsEqual(a, b));
}

TEST(NewRunSecret, IsFreshHex) {
  Result<std::string> a = NewRunSecret();
  Result<std::string> b = NewRunSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
}

// --run-secret-file: the content without its trailing newline; a file others may read, an
// empty one, a missing one, and both flags at once are each refused naming the path or flag.
TEST(RunSecretFile, ReadsTheSecretAndRefusesWhatCannotHoldOne) {
  testing::TempDir dir("strata_run_secret");
  const std::string file = dir.File("secret");
  auto write = [&](const std::string& text, mode_t mode) {
    std::ofstream(file, std::ios::trunc) << text;
    ASSERT_EQ(::chmod(file.c_str(), mode), 0);
  };
  write("s3cret\n", 0600);
  Result<std::string> s = ReadRunSecretFile(file);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, "s3cret");
  Result<std::string> flags = RunSecretFromFlags("", file);
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(*flags, "s3cret");
  EXPECT_EQ(*RunSecretFromFlags("given", ""), "given");
  EXPECT_EQ(*RunSecretFromFlags("", ""), "");

  Result<std::string> both = RunSecretFromFlags("given", file);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("--run-secret and --run-secret-file"), std::string::npos);

  write("s3cret\n", 0644);
  Result<std::string> readable = ReadRunSecretFile(file);
  ASSERT_FALSE(readable.ok());
  EXPECT_NE(readable.status().message().find("mode 644"), std::string::npos)
      << readable.status().ToString();
  EXPECT_NE(readable.status().message().find("chmod 600 " + file), std::string::npos);

  write(" \n", 0600);
  Result<std::string> empty = ReadRunSecretFile(file);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);

  Result<std::string> missing = ReadRunSecretFile(dir.File("none"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().ToString().find(dir.File("none")), std::string::npos);
}

}  // namespace
}  // namespace strata
