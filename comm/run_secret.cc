// The run secret and HMAC-SHA256; see comm/run_secret.h.
#include "comm/run_secret.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>

namespace strata {

HmacSha256Digest HmacSha256(std::string_view key, std::string_view data) {
  HmacSha256Digest out{};
  unsigned int len = 0;
  // Empty inputs still need valid pointers for OpenSSL.
  static const unsigned char kNothing = 0;
  const auto* k = key.empty() ? &kNothing : reinterpret_cast<const unsigned char*>(key.data());
  const auto* d = data.empty() ? &kNothing : reinterpret_cast<const unsigned char*>(data.data());
  ::HMAC(EVP_sha256(), k, static_cast<int>(key.size()), d, data.size(), out.data(), &len);
  return out;
}

bool DigestsEqual(const HmacSha256Digest& a, const HmacSha256Digest& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

Result<std::string> NewRunSecret() {
  uint8_t bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno(errno, "getrandom (making the run secret)");
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace strata
