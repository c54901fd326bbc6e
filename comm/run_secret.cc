// The run secret and HMAC-SHA256; see comm/run_secret.h.
#include "comm/run_secret.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

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

Result<std::string> ReadRunSecretFile(const std::string& path) {
  const std::string what = "--run-secret-file " + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, what + " (reading the run secret)");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno(e, what);
  }
  if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return Status::InvalidArgument(what + ": other users may read the run secret (mode " + mode +
                                   "); make it readable by its owner alone: chmod 600 " + path);
  }
  std::string secret;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return Status::FromErrno(e, what);
    }
    if (n == 0) break;
    secret.append(buf, static_cast<size_t>(n));
    if (secret.size() > (1u << 20)) {
      ::close(fd);
      return Status::InvalidArgument(what + ": over 1 MiB, not a run secret");
    }
  }
  ::close(fd);
  while (!secret.empty() && std::string_view(" \t\r\n").find(secret.back()) != std::string::npos) {
    secret.pop_back();
  }
  if (secret.empty()) {
    return Status::InvalidArgument(what +
                                   ": the file is empty; put the secret in it (e.g. "
                                   "openssl rand -hex 32 > " +
                                   path + ")");
  }
  return secret;
}

Result<std::string> RunSecretFromFlags(const std::string& value, const std::string& path) {
  if (!value.empty() && !path.empty()) {
    return Status::InvalidArgument(
        "--run-secret and --run-secret-file " + path +
        " both give the run secret: pass one (the file keeps it out of ps)");
  }
  if (!path.empty()) return ReadRunSecretFile(path);
  return value;
}

}  // namespace strata
