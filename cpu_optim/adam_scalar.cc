// The portable kernels: one element at a time, compiled without ISA flags so they run on
// any x86-64 (and any other CPU). std::fma is the correctly rounded fused multiply-add
// (the FMA instruction where the CPU has one, glibc's exact software version otherwise),
// so this path computes the very bits of the SIMD paths. Formula: include/strata/optim.h.
#include <cmath>
#include <cstdint>

#include "cpu_optim/convert.h"
#include "cpu_optim/int8_templates.h"
#include "cpu_optim/kernel_templates.h"
#include "cpu_optim/kernels.h"

namespace strata::cpu_optim {
namespace {

struct ScalarVec {
  static constexpr size_t kWidth = 1;
  using F = float;
  struct Tail {};
  static Tail MakeTail(size_t) { return {}; }
  static F Set1(float x) { return x; }
  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Fma(F a, F b, F c) { return std::fma(a, b, c); }
  template <bool kTail>
  static F LoadF32(const float* p, const Tail&) {
    return *p;
  }
  template <bool kTail>
  static F LoadBf16(const uint16_t* p, const Tail&) {
    return Bf16BitsToFloat(*p);
  }
  template <bool kTail>
  static F LoadFp16(const uint16_t* p, const Tail&) {
    return Fp16BitsToFloat(*p);
  }
  template <bool kTail>
  static void StoreF32(float* p, F x, const Tail&) {
    *p = x;
  }
  template <bool kTail>
  static void StoreBf16(uint16_t* p, F x, const Tail&) {
    *p = FloatToBf16Bits(x);
  }
  template <bool kTail>
  static void StoreFp16(uint16_t* p, F x, const Tail&) {
    *p = FloatToFp16Bits(x);
  }
  template <bool kTail>
  static void StoreTrunc16(uint16_t* p, F x, const Tail&) {
    *p = static_cast<uint16_t>(FloatBits(x) >> 16);
  }
  using R = uint32_t;
  static R RandomBits(uint32_t first, uint32_t key) { return Mix32(first + key); }
  static R LaneIndex(uint32_t first) { return first; }
  static R Mix(R x) { return Mix32(x); }
  template <bool kHigh, bool kTail>
  static void StoreBf16Stochastic(uint16_t* p, F x, R r, const Tail&) {
    const uint32_t b = FloatBits(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
      *p = static_cast<uint16_t>((b >> 16) | 0x0040u);  // NaN: as FloatToBf16Bits
      return;
    }
    const uint32_t add = kHigh ? r >> 16 : r & 0xffffu;
    *p = static_cast<uint16_t>((b + add) >> 16);
  }
  // Integer lanes for int8_templates.h; a mask lane is all ones or 0.
  static R Bits(F x) { return FloatBits(x); }
  static F FromBits(R x) { return BitsFloat(x); }
  static R And(R a, R b) { return a & b; }
  static R Or(R a, R b) { return a | b; }
  static R AndNot(R a, R b) { return ~a & b; }
  template <int kN>
  static R ShrL(R a) {
    return a >> kN;
  }
  template <int kN>
  static R ShrA(R a) {
    return static_cast<R>(static_cast<int32_t>(a) >> kN);
  }
  template <int kN>
  static R Shl(R a) {
    return a << kN;
  }
  static R AddI(R a, R b) { return a + b; }
  static R SubI(R a, R b) { return a - b; }
  static R Set1I(uint32_t x) { return x; }
  static R MinI(R a, R b) { return static_cast<int32_t>(a) < static_cast<int32_t>(b) ? a : b; }
  static R MaxI(R a, R b) { return static_cast<int32_t>(a) > static_cast<int32_t>(b) ? a : b; }
  static R CmpGtI(R a, R b) { return static_cast<int32_t>(a) > static_cast<int32_t>(b) ? ~0u : 0u; }
  static R CmpEqI(R a, R b) { return a == b ? ~0u : 0u; }
  static R CmpLtF(F a, F b) { return a < b ? ~0u : 0u; }
  static F CvtI(R a) { return static_cast<float>(static_cast<int32_t>(a)); }
  static R TruncI(F a) { return static_cast<R>(static_cast<int32_t>(a)); }
  static F FromHalf(R x) { return Fp16BitsToFloat(static_cast<uint16_t>(x)); }
  static uint32_t HMaxI(R a) { return a; }
  template <bool kTail>
  static R LoadU8(const uint8_t* p, const Tail&) {
    return *p;
  }
  template <bool kTail>
  static void StoreU8(uint8_t* p, R x, const Tail&) {
    *p = static_cast<uint8_t>(x);
  }
};

float LoadAsFloat(const void* grad, FloatFormat format, size_t i) {
  switch (format) {
    case FloatFormat::kFp32:
      return static_cast<const float*>(grad)[i];
    case FloatFormat::kBf16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(grad)[i]);
    case FloatFormat::kFp16:
      return Fp16BitsToFloat(static_cast<const uint16_t*>(grad)[i]);
  }
  return 0.0f;
}

void NormBlockScalar(const void* grad, FloatFormat format, size_t begin, size_t end,
                     double* sum_squares, uint64_t* non_finite) {
  double lanes[16] = {};
  uint64_t bad = 0;
  for (size_t i = begin; i < end; ++i) {
    const float x = LoadAsFloat(grad, format, i);
    bad += (FloatBits(x) & 0x7f800000u) == 0x7f800000u;
    const double d = x;
    lanes[i % 16] += d * d;  // the square of a float is exact in double
  }
  *sum_squares = ReduceNormLanes(lanes);
  *non_finite = bad;
}

}  // namespace

void QuantizeInt8Block(const float* exp_avg, const float* exp_avg_sq, size_t n,
                       uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code, float* exp_avg_scale,
                       float* exp_avg_sq_scale) {
  uint32_t m_max = 0, u_max = 0;
  for (size_t i = 0; i < n; ++i) {
    m_max = ScalarVec::MaxI(m_max, FloatBits(exp_avg[i]) & 0x7fffffffu);
    u_max = ScalarVec::MaxI(u_max, FloatBits(std::sqrt(exp_avg_sq[i])) & 0x7fffffffu);
  }
  *exp_avg_scale = BitsFloat(m_max);
  *exp_avg_sq_scale = BitsFloat(u_max);
  const float m_inv = InverseScale(*exp_avg_scale);
  const float u_inv = InverseScale(*exp_avg_sq_scale);
  for (size_t i = 0; i < n; ++i) {
    exp_avg_code[i] = static_cast<uint8_t>(
        Int8Quantize<ScalarVec, ExpAvgMap>(exp_avg[i], m_inv, kNearestBitsExpAvg));
    exp_avg_sq_code[i] = static_cast<uint8_t>(Int8Quantize<ScalarVec, ExpAvgSqMap>(
        std::sqrt(exp_avg_sq[i]), u_inv, kNearestBitsExpAvgSq));
  }
}

void DequantizeInt8Block(const uint8_t* exp_avg_code, const uint8_t* exp_avg_sq_code,
                         float exp_avg_scale, float exp_avg_sq_scale, size_t n, float* exp_avg,
                         float* exp_avg_sq) {
  for (size_t i = 0; i < n; ++i) {
    exp_avg[i] = Int8Dequantize<ScalarVec, ExpAvgMap>(exp_avg_code[i], exp_avg_scale);
    const float u = Int8Dequantize<ScalarVec, ExpAvgSqMap>(exp_avg_sq_code[i], exp_avg_sq_scale);
    exp_avg_sq[i] = u * u;
  }
}

const IsaKernels& ScalarKernels() {
  static const IsaKernels kernels{CpuIsa::kScalar,
                                  &AdamDispatch<ScalarVec>,
                                  &TrafficDispatch<ScalarVec>,
                                  &NormBlockScalar,
                                  &ScaleDispatch<ScalarVec>,
                                  &ConvertDispatch<ScalarVec>,
                                  &AdamInt8Dispatch<ScalarVec>,
                                  &TrafficInt8Dispatch<ScalarVec>};
  return kernels;
}

}  // namespace strata::cpu_optim
