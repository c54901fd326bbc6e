// fp32 -> bf16/fp16 rounding against a bit-level reference written independently here
// (exact arithmetic in double: scale to the format's quantum, rint with ties to even,
// re-encode), for the scalar helpers and for every ISA's vector kernels: ties, subnormal
// inputs and outputs, overflow, Inf and NaN.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "strata/optim.h"
#include "tests/cpu_optim/test_util.h"

namespace strata {
namespace {

using test::Bits;
using test::FromBits;

struct Format {
  int mant_bits;                                          // stored mantissa bits: bf16 7, fp16 10
  int exp_bits;                                           // bf16 8, fp16 5
  int emin() const { return 2 - (1 << (exp_bits - 1)); }  // smallest normal exponent
  int emax() const { return (1 << (exp_bits - 1)) - 1; }
  int bias() const { return emax(); }
};
constexpr Format kBf16Format{7, 8};
constexpr Format kFp16Format{10, 5};

// Reference: the IEEE round-to-nearest-even result of `f` in `fmt`, as bits.
uint16_t ReferenceRound(float f, Format fmt) {
  const uint32_t b = Bits(f);
  const uint16_t sign = static_cast<uint16_t>(b >> 31) << 15;
  const uint16_t exp_all_ones = static_cast<uint16_t>(((1u << fmt.exp_bits) - 1) << fmt.mant_bits);
  if (std::isnan(f)) {
    // Quiet NaN; the upper payload bits that fit are kept.
    const uint32_t payload = (b & 0x7fffffu) >> (23 - fmt.mant_bits);
    return sign | exp_all_ones | static_cast<uint16_t>(payload) |
           static_cast<uint16_t>(1u << (fmt.mant_bits - 1));
  }
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(x)) return sign | exp_all_ones;
  if (x == 0.0) return sign;
  int e;
  std::frexp(x, &e);  // x in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, fmt.emin());
  const double quantum = std::ldexp(1.0, exponent - fmt.mant_bits);
  EXPECT_EQ(std::fegetround(), FE_TONEAREST);
  const double r = std::nearbyint(x / quantum) * quantum;  // x / quantum is exact
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -fmt.mant_bits), fmt.emax());
  if (r > max_finite) return sign | exp_all_ones;
  if (r < std::ldexp(1.0, fmt.emin())) {  // subnormal (or zero) result
    return sign | static_cast<uint16_t>(r / std::ldexp(1.0, fmt.emin() - fmt.mant_bits));
  }
  int re;
  const double frac = std::frexp(r, &re);  // r = frac * 2^re, frac in [0.5, 1)
  const uint32_t mant = static_cast<uint32_t>((frac * 2.0 - 1.0) * (1u << fmt.mant_bits));
  return sign | static_cast<uint16_t>(((re - 1 + fmt.bias()) << fmt.mant_bits) | mant);
}

// Value of bits in `fmt`, computed from the definition.
double ReferenceValue(uint16_t h, Format fmt) {
  const int e = (h >> fmt.mant_bits) & ((1 << fmt.exp_bits) - 1);
  const int m = h & ((1 << fmt.mant_bits) - 1);
  const double sign = (h >> 15) ? -1.0 : 1.0;
  if (e == (1 << fmt.exp_bits) - 1) {
    return m ? std::numeric_limits<double>::quiet_NaN()
             : sign * std::numeric_limits<double>::infinity();
  }
  if (e == 0) return sign * std::ldexp(m, fmt.emin() - fmt.mant_bits);
  return sign * std::ldexp(1.0 + std::ldexp(m, -fmt.mant_bits), e - fmt.bias());
}

// Interesting inputs: specials, every boundary of both formats (+-1 ulp around each),
// exact ties and near-ties, fp32 subnormals, plus random bit patterns.
std::vector<float> Inputs() {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fffffffu,
                                0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x00400000u, 0x007fffffu,
                                0x80400000u, 0x00018000u, 0x00008000u, 0x00807fffu};
  for (float f :
       {65504.0f, 65519.0f, 65520.0f, 65536.0f, 6.103515625e-05f, 5.9604645e-08f, 2.98023224e-08f,
        8.9406967e-08f, 1.0f, 1.00390625f, 1.01171875f, 3.0e38f, 3.3961776e38f, 3.39e38f}) {
    bits.push_back(Bits(f));
  }
  std::vector<uint32_t> around;
  for (uint32_t b : bits) {
    for (int d = -2; d <= 2; ++d) around.push_back(b + d);
  }
  // Exact ties for both formats at many exponents: low bits 1000..0 below the kept bits.
  for (uint32_t e = 0; e < 255; e += 3) {
    for (uint32_t keep : {0u, 1u, 2u, 3u, 0x7fu}) {
      around.push_back((e << 23) | (keep << 16) | 0x8000u);  // bf16 tie
      around.push_back((e << 23) | (keep << 13) | 0x1000u);  // fp16 normal tie
      around.push_back((1u << 31) | (e << 23) | (keep << 16) | 0x8000u);
    }
  }
  // fp16 subnormal ties: k + 0.5 quanta of 2^-24.
  for (int k = 0; k < 1030; k += 1) around.push_back(Bits(std::ldexp(k + 0.5, -24)));
  std::mt19937 rng(12345);
  for (int i = 0; i < 200000; ++i) around.push_back(rng());
  // Every 2^-24-spaced value in the fp16 subnormal range region, and the normal onset.
  for (uint32_t b = 0x33000000u; b < 0x38900000u; b += 0x1001u) around.push_back(b);
  std::vector<float> out;
  out.reserve(around.size());
  for (uint32_t b : around) out.push_back(FromBits(b));
  return out;
}

TEST(ConvertTest, ScalarBf16MatchesReference) {
  for (float f : Inputs()) {
    ASSERT_EQ(FloatToBf16(f), ReferenceRound(f, kBf16Format))
        << "input bits 0x" << std::hex << Bits(f);
  }
}

TEST(ConvertTest, ScalarFp16MatchesReference) {
  for (float f : Inputs()) {
    ASSERT_EQ(FloatToFp16(f), ReferenceRound(f, kFp16Format))
        << "input bits 0x" << std::hex << Bits(f);
  }
}

TEST(ConvertTest, SpotValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(FromBits(0x00400000u)), 0x0040);  // subnormal kept, not flushed
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffffu)), 0x7f80);  // overflow -> Inf
  EXPECT_EQ(FloatToBf16(FromBits(0x7f800001u)), 0x7fc0);  // signalling NaN -> quiet NaN
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);               // tie to even = Inf
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even = 0
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta -> 2
  EXPECT_EQ(FloatToFp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
}

TEST(ConvertTest, WideningIsExactForEveryEncoding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const double want_bf16 = ReferenceValue(bits, kBf16Format);
    const double want_fp16 = ReferenceValue(bits, kFp16Format);
    const float got_bf16 = Bf16ToFloat(bits);
    const float got_fp16 = Fp16ToFloat(bits);
    if (std::isnan(want_bf16)) {
      ASSERT_TRUE(std::isnan(got_bf16)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got_bf16), want_bf16) << h;
      ASSERT_EQ(FloatToBf16(got_bf16), bits) << h;  // round trip
    }
    if (std::isnan(want_fp16)) {
      ASSERT_TRUE(std::isnan(got_fp16)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got_fp16), want_fp16) << h;
      ASSERT_EQ(FloatToFp16(got_fp16), bits) << h;
    }
  }
}

// The vector kernels (and their tails) give the reference's bits, for every ISA.
TEST(ConvertTest, KernelsMatchReferenceOnEveryIsa) {
  const std::vector<float> in = Inputs();
  for (CpuIsa isa : test::SupportedIsas()) {
    for (FloatFormat fmt : {FloatFormat::kBf16, FloatFormat::kFp16}) {
      for (size_t offset : {0, 3}) {
        const size_t n = in.size() - offset;  // odd lengths exercise the tails
        std::vector<uint16_t> out(n);
        CpuKernelOptions opt;
        opt.isa = isa;
        opt.threads = 2;
        ASSERT_TRUE(ConvertFromFloat(in.data() + offset, out.data(), fmt, n, opt).ok());
        const Format ref_fmt = fmt == FloatFormat::kBf16 ? kBf16Format : kFp16Format;
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out[i], ReferenceRound(in[i + offset], ref_fmt))
              << CpuIsaName(isa) << " " << FloatFormatName(fmt) << " input 0x" << std::hex
              << Bits(in[i + offset]);
        }
      }
    }
  }
}

// AdamStep's copy-out and ScaleGradients round through the same stores: check them on
// the specials too (param_out must equal the rounded master, NaN included).
TEST(ConvertTest, ScaleGradientsRoundsLikeReference) {
  const std::vector<float> in = Inputs();
  for (CpuIsa isa : test::SupportedIsas()) {
    CpuKernelOptions opt;
    opt.isa = isa;
    std::vector<uint16_t> g(in.size());
    for (size_t i = 0; i < in.size(); ++i) g[i] = FloatToBf16(in[i]);
    const float scale = 0.7f;
    ASSERT_TRUE(ScaleGradients(g.data(), FloatFormat::kBf16, g.size(), scale, opt).ok());
    for (size_t i = 0; i < in.size(); ++i) {
      const float want = Bf16ToFloat(FloatToBf16(in[i])) * scale;
      ASSERT_EQ(g[i], ReferenceRound(want, kBf16Format)) << CpuIsaName(isa) << " " << i;
    }
  }
}

}  // namespace
}  // namespace strata
