// Helpers for the I/O tests: unique temporary folders on a file system with O_DIRECT
// (/var/tmp is ext4 here; /tmp may be tmpfs elsewhere), page-aligned buffers, a checksum
// the tests compute themselves, and the seed of a property test.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "strata/env.h"
#include "tests/temp_dir.h"

namespace strata::testing {

// Page-aligned heap memory (O_DIRECT needs aligned buffers), zero-filled.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : size_(size) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, size == 0 ? 4096 : size) != 0) p = nullptr;
    data_ = static_cast<char*>(p);
    if (data_) std::memset(data_, 0, size == 0 ? 4096 : size);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// FNV-1a, 64-bit: the tests' own checksum, independent of the code under test.
inline uint64_t Fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Deterministic pattern: byte i of a block depends on the seed, the block and i.
inline void FillPattern(void* data, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* p = static_cast<unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  uint64_t v = rng();
  for (; i < n; ++i, v >>= 8) p[i] = static_cast<unsigned char>(v);
}

// The seed of a property test: STRATA_TEST_SEED when set (to replay a failure), else
// from the clock. Printed so a failure can be replayed.
inline uint64_t TestSeed() {
  const std::string s = EnvGet("STRATA_TEST_SEED");
  uint64_t seed =
      !s.empty()
          ? std::strtoull(s.c_str(), nullptr, 10)
          : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("[ seed     ] STRATA_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace strata::testing
