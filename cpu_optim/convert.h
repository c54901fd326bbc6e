// Scalar fp32 <-> bf16/fp16 conversions used by every kernel path (the scalar kernel, the
// AVX2 tails) and by the public FloatToBf16 & co. They define the bits the vector
// instructions must reproduce: round to nearest even, overflow to Inf, NaN kept NaN with
// sign and upper payload and the quiet bit set (what VCVTPS2PH does), no flush to zero.
//
// Internal linkage on purpose: each per-ISA translation unit is compiled with its own
// -m flags, and an inline function with external linkage would let the linker keep the
// AVX-512 copy for the scalar path (SIGILL on an older CPU). Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::cpu_optim {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

inline float BitsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

inline float Bf16BitsToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t b = FloatBits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out
  // of the mantissa bumps the exponent, up to Inf, which is what RNE overflow gives.
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

inline float Fp16BitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return BitsFloat(sign | FloatBits(mag));
}

inline uint16_t FloatToFp16Bits(float f) {
  const uint32_t b = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf (and Inf itself)
  if (a >= 0x38800000u) {                       // normal fp16: rebias 127 -> 15
    const uint32_t r = a - 0x38000000u;
    return sign | static_cast<uint16_t>((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
  }
  // Subnormal fp16 (or zero): value = m * 2^(e-150); result = RNE(m * 2^(e-126)).
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25 (fp32 subnormals included): rounds to zero
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
  return sign | static_cast<uint16_t>(q);
}

// The "lowbias32" integer hash (Chris Wellons' hash-prospector): the random bits of
// stochastic rounding (see AdamSlice in include/strata/optim.h). Every ISA computes exactly
// this per element.
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

}  // namespace
}  // namespace strata::cpu_optim
