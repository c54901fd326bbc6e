// Helpers shared by the cpu_optim tests: the ISAs this CPU can run, buffers placed at a
// chosen misalignment, bit-exact comparison with the first differing index reported, the
// stochastic rounding's hash.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/optim.h"

namespace strata::test {

// The documented hash of stochastic rounding ("lowbias32", AdamSlice in strata/optim.h),
// written from its documentation rather than taken from cpu_optim/convert.h: the bf16 and int8
// state tests check the kernels against it.
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

inline std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

// n elements of T starting `offset` elements past a 64-byte boundary.
template <class T>
class OffsetBuffer {
 public:
  OffsetBuffer(size_t n, size_t offset) : storage_(n + offset + 64 / sizeof(T) + 1) {
    uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    size_t skip = ((64 - base % 64) % 64) / sizeof(T);
    data_ = storage_.data() + skip + offset;
    n_ = n;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  std::vector<T> storage_;
  T* data_;
  size_t n_;
};

// Index of the first element whose bytes differ, or -1.
template <class T>
int64_t FirstBitDifference(const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

inline uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace strata::test
