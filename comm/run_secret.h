// The run secret of a rendezvous: a random key that `strata launch` makes (or the user gives
// with --run-secret / STRATA_RUN_SECRET), and the HMAC-SHA256 (RFC 2104 over FIPS 180-4, by
// OpenSSL's libcrypto) with which every rank signs the keys it publishes in the rendezvous,
// so that a process without the secret can neither join a run nor forge a rank's endpoints.
//
// Stateless functions, safe for concurrent use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

inline constexpr size_t kHmacSha256Bytes = 32;
using HmacSha256Digest = std::array<uint8_t, kHmacSha256Bytes>;

// HMAC-SHA256 of `data` under `key` (any length; RFC 4231's test vectors hold).
HmacSha256Digest HmacSha256(std::string_view key, std::string_view data);

// Whether a and b are equal, in time that does not depend on where they differ.
bool DigestsEqual(const HmacSha256Digest& a, const HmacSha256Digest& b);

// A fresh run secret: 32 bytes from the kernel's getrandom, as 64 lowercase hex digits (so
// that it passes through an environment variable). IOError naming getrandom when the kernel
// gives none.
Result<std::string> NewRunSecret();

// The run secret kept in the file `path` (--run-secret-file), so that it shows neither in
// `ps` nor in the environment: the file's content without its trailing whitespace (a
// newline). Errors name the path: NotFound / IOError (with errno) when it cannot be read,
// InvalidArgument when it holds no secret, or when its group or other users may read it
// ("chmod 600 PATH"), as ssh refuses a private key.
Result<std::string> ReadRunSecretFile(const std::string& path);

// The run secret a command line gives: --run-secret `value`, else the file
// --run-secret-file `path`, else "" (then STRATA_RUN_SECRET, where the rendezvous reads
// it). InvalidArgument when both are given; ReadRunSecretFile's errors.
Result<std::string> RunSecretFromFlags(const std::string& value, const std::string& path);

}  // namespace strata
