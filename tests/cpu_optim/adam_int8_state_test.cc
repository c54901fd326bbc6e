// AdamStep with int8 moments (StateFormat::kInt8): each step's moments equal the fp32-state
// step's on the dequantized moments, requantized as include/strata/optim.h documents (the
// maps, the stochastic rounding with the hash bits and the folded weight update are
// re-implemented here from that text), bit for bit on every ISA and thread count; conversions round
// trip within the maps' precision; the stochastic rounding keeps exp_avg_sq's 0.1% decay that
// nearest rounding would lose; and a small problem trains like fp32 states.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "strata/optim.h"
#include "tests/cpu_optim/test_util.h"

namespace strata {
namespace {

using test::Mix32;

// The documented value of a code, times the scale (before squaring for exp_avg_sq).
float CodeValue(uint8_t code, int mant_bits, bool is_signed, float scale) {
  const uint32_t mag = is_signed ? code & 0x7fu : code;
  const uint32_t e = mag >> mant_bits, m = mag & ((1u << mant_bits) - 1u);
  // E = 0: fp16's subnormals, 2^-14 * M / 2^mant_bits (the quantizer writes only M = 0).
  const float frac = float(m) / float(1u << mant_bits);
  float y = e == 0 ? std::ldexp(frac, -14) : std::ldexp(1.0f + frac, int(e) - 15);
  if (is_signed && (code & 0x80u)) y = -y;
  return y * scale;
}

// The documented stochastic quantization of x with y = x * (1/scale), `bits` random bits.
uint8_t QuantizeRef(float x, float scale, uint32_t bits, int mant_bits, bool is_signed) {
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  const float y = x * inv;
  const uint32_t b = test::Bits(y), a = b & 0x7fffffffu;
  const uint32_t sign = is_signed ? (b >> 24) & 0x80u : 0u;
  const int drop = 23 - mant_bits;
  if (std::fabs(y) < 0x1p-14f) {
    bool up;
    if (is_signed) {
      up = float(bits >> 8) * 0x1p-24f < std::fabs(y) * 16384.0f;
    } else {
      up = a != 0;
    }
    return uint8_t(sign | (up ? 1u << mant_bits : 0u));
  }
  const uint32_t r = a + (bits & ((1u << drop) - 1u));
  const uint32_t e = (r >> 23) - 112, m = (r >> drop) & ((1u << mant_bits) - 1u);
  const uint32_t max_mag = (15u << mant_bits) | ((1u << mant_bits) - 1u);
  return uint8_t(sign | std::min((e << mant_bits) + m, max_mag));
}

struct State {
  std::vector<float> p;
  std::vector<uint8_t> m, v;
  std::vector<float> m_scale, v_scale;
};

// Random fp32 moments spread over several decades, quantized.
State RandomState(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> m(n), v(n);
  State s{std::vector<float>(n), std::vector<uint8_t>(n), std::vector<uint8_t>(n),
          std::vector<float>(Int8StateBlocks(n)), std::vector<float>(Int8StateBlocks(n))};
  for (size_t i = 0; i < n; ++i) {
    const float decade = std::pow(10.0f, -float(i % 5));
    s.p[i] = normal(rng);
    m[i] = 0.1f * decade * normal(rng);
    v[i] = 0.01f * decade * decade * normal(rng) * normal(rng);
    v[i] = std::fabs(v[i]) + (i % 13 == 0 ? 0.0f : 1e-12f);
  }
  EXPECT_TRUE(QuantizeInt8Moments(m.data(), v.data(), n, s.m.data(), s.v.data(), s.m_scale.data(),
                                  s.v_scale.data())
                  .ok());
  return s;
}

std::vector<float> Grad(size_t n, int64_t step) {
  std::mt19937 rng(uint32_t(n * 7 + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = (i % 11 == 0) ? 0.0f : normal(rng) * 0.3f * std::pow(10.0f, -float(i % 3));
  }
  return g;
}

AdamHyperParams Hyper(int64_t step) {
  AdamHyperParams h;
  h.lr = 3e-3;
  h.weight_decay = 0.05;
  h.step = step;
  return h;
}

AdamSlice Int8Slice(State* s, const float* g, size_t n, uint64_t key) {
  AdamSlice sl;
  sl.master = s->p.data();
  sl.exp_avg = s->m.data();
  sl.exp_avg_sq = s->v.data();
  sl.exp_avg_scale = s->m_scale.data();
  sl.exp_avg_sq_scale = s->v_scale.data();
  sl.grad = g;
  sl.n = n;
  sl.state_format = StateFormat::kInt8;
  sl.rounding_key = key;
  return sl;
}

// The documented kInt8 weight update (optim.h: the bias correction folded into the
// constants) of the AdamW weights p from the new moments m and v.
std::vector<float> FoldedAdamW(const std::vector<float>& p, const std::vector<float>& m,
                               const std::vector<float>& v, const AdamHyperParams& h) {
  EXPECT_EQ(h.mode, AdamMode::kAdamW);
  const double t = double(h.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, t));
  const float neg_step = float(-h.lr / (1.0 - std::pow(h.beta1, t)) * bc2_sqrt);
  const float eps = float(h.eps * bc2_sqrt), neg_lr_wd = float(-h.lr * h.weight_decay);
  std::vector<float> out(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const float ratio = m[i] / (std::sqrt(v[i]) + eps);
    out[i] = p[i] + std::fma(neg_step, ratio, neg_lr_wd * p[i]);
  }
  return out;
}

// The documented kInt8 moments (optim.h, "int8 moments": the scales and the gradient scale
// folded into the constants) of AdamW from the codes and scales of `s` and the gradient g:
// the new m and v, in place of the dequantized old ones in m and v.
void FoldedInt8Moments(const State& s, const std::vector<float>& g, const AdamHyperParams& h,
                       float grad_scale, std::vector<float>* m, std::vector<float>* v) {
  ASSERT_EQ(h.mode, AdamMode::kAdamW);
  const float gm = float((1.0 - h.beta1) * grad_scale);
  const float gv = float(std::sqrt(1.0 - h.beta2) * grad_scale);
  for (size_t i = 0; i < g.size(); ++i) {
    const size_t b = i / kInt8StateBlock;
    const float m_coef = float(h.beta1) * s.m_scale[b];
    const float u_coef = float(std::sqrt(h.beta2)) * s.v_scale[b];
    const float t = CodeValue(s.v[i], 4, false, 1.0f) * u_coef, hv = gv * g[i];
    (*m)[i] = std::fma(CodeValue(s.m[i], 3, true, 1.0f), m_coef, gm * g[i]);
    (*v)[i] = std::fma(hv, hv, t * t);
  }
}

// One step of the int8 kernel on `s` equals the documented step (FoldedInt8Moments, then
// FoldedAdamW) on the old codes, requantized as documented (codes and scales), on `isa`; its
// moments are the fp32-state step's on the dequantized moments up to 8 ulps of their terms (the
// folding rounds differently).
void ExpectTheFp32StepRequantized(State s, const std::vector<float>& g, const AdamHyperParams& h,
                                  float grad_scale, ParamOut out, StateRounding rounding,
                                  CpuIsa isa) {
  ASSERT_NE(out, ParamOut::kFp16);
  const size_t n = s.p.size();
  const bool nearest = rounding == StateRounding::kNearestEven;
  std::vector<float> p32 = s.p, m32(n), v32(n);
  ASSERT_TRUE(DequantizeInt8Moments(s.m.data(), s.v.data(), s.m_scale.data(), s.v_scale.data(), n,
                                    m32.data(), v32.data())
                  .ok());
  const std::vector<float> m_old = m32;
  const AdamSlice ref{p32.data(),         m32.data(), v32.data(),      g.data(),
                      FloatFormat::kFp32, nullptr,    ParamOut::kNone, n};
  CpuKernelOptions opt;
  opt.isa = isa;
  ASSERT_TRUE(AdamStep(ref, h, grad_scale, opt).ok());
  const std::vector<float> m_fp32 = m32, v_fp32 = v32;
  FoldedInt8Moments(s, g, h, grad_scale, &m32, &v32);
  for (size_t i = 0; i < n; ++i) {
    const double terms =
        std::fabs(h.beta1 * m_old[i]) + std::fabs((1 - h.beta1) * grad_scale * g[i]);
    ASSERT_LE(std::fabs(m32[i] - m_fp32[i]), 0x1p-20 * terms + 1e-38) << "exp_avg " << i;
    ASSERT_LE(std::fabs(v32[i] - v_fp32[i]), 0x1p-20 * v_fp32[i] + 1e-38) << "exp_avg_sq " << i;
  }
  std::vector<uint16_t> out8(n);
  const uint64_t key = 0xfeedface12345678ull;
  AdamSlice sl = Int8Slice(&s, g.data(), n, key);
  if (out != ParamOut::kNone) sl.param_out = out8.data(), sl.param_out_format = out;
  sl.state_rounding = rounding;
  const std::vector<float> p_want = FoldedAdamW(s.p, m32, v32, h);
  ASSERT_TRUE(AdamStep(sl, h, grad_scale, opt).ok());
  ASSERT_EQ(test::FirstBitDifference(s.p.data(), p_want.data(), n), -1);
  if (out == ParamOut::kBf16) {
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out8[i], FloatToBf16(p_want[i])) << i;
  }
  const uint32_t k = Mix32(uint32_t(key ^ (key >> 32)));
  for (size_t b = 0; b < Int8StateBlocks(n); ++b) {
    const size_t lo = b * kInt8StateBlock, hi = std::min(n, lo + kInt8StateBlock);
    float m_max = 0, u_max = 0;
    for (size_t i = lo; i < hi; ++i) {
      m_max = std::max(m_max, std::fabs(m32[i]));
      u_max = std::max(u_max, std::sqrt(v32[i]));
    }
    ASSERT_EQ(s.m_scale[b], m_max) << "block " << b;
    ASSERT_EQ(s.v_scale[b], u_max) << "block " << b;
    for (size_t i = lo; i < hi; ++i) {
      // Nearest: half of the dropped bits (m: and an underflow threshold just above 1/2).
      const uint32_t h = nearest ? 0x80080000u : Mix32(uint32_t(i) + k);
      ASSERT_EQ(s.m[i], QuantizeRef(m32[i], m_max, h, 3, true))
          << "exp_avg " << i << " bits " << std::hex << test::Bits(m32[i]);
      const uint32_t high = nearest ? 0x00040000u : h >> 13;  // sqrt(exp_avg_sq): h's top 19
      ASSERT_EQ(s.v[i], QuantizeRef(std::sqrt(v32[i]), u_max, high, 4, false))
          << "exp_avg_sq " << i << " bits " << std::hex << test::Bits(std::sqrt(v32[i]));
    }
  }
}

TEST(AdamInt8StateTest, EqualsTheFp32StepRequantizedAsDocumented) {
  for (size_t n : {size_t(1), size_t(15), size_t(17), size_t(2047), size_t(2048), size_t(2049),
                   size_t(70001)}) {
    for (auto [out, rounding] : {std::pair{ParamOut::kNone, StateRounding::kStochastic},
                                 std::pair{ParamOut::kBf16, StateRounding::kStochastic},
                                 std::pair{ParamOut::kBf16, StateRounding::kNearestEven}}) {
      SCOPED_TRACE("n " + std::to_string(n) + " out " + ParamOutName(out) + " " +
                   StateRoundingName(rounding));
      ExpectTheFp32StepRequantized(RandomState(n, uint32_t(n)), Grad(n, 5), Hyper(5), 0.5f, out,
                                   rounding, CpuIsa::kAuto);
    }
  }
}

// Every code of both maps, decoded by every ISA (AVX2 decodes four vectors at a time by
// table lookups, the others one vector at a time; a tail after both): the step equals the
// fp32 step on the documented values.
TEST(AdamInt8StateTest, DecodesEveryCodeAsDocumented) {
  const size_t n = 2 * kInt8StateBlock + 37;
  State s = RandomState(n, 9);
  for (size_t i = 0; i < n; ++i) {
    s.m[i] = uint8_t(i);
    s.v[i] = uint8_t(i * 7 + 3);
  }
  for (CpuIsa isa : test::SupportedIsas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    ExpectTheFp32StepRequantized(s, Grad(n, 5), Hyper(5), 0.5f, ParamOut::kBf16,
                                 StateRounding::kNearestEven, isa);
  }
}

// The maps' edges on every ISA: with beta1 = beta2 = 0 the new m is the gradient and
// sqrt(v) its magnitude, and each block's absmax is 1, so the quantizer sees exactly the bit
// patterns around the smallest code (2^-14), the underflow threshold of nearest rounding
// (2^-15 (1 + 2^-12)), 2^-15, rounding midpoints, the largest codes, sub-normals and zeros.
TEST(AdamInt8StateTest, QuantizesTheEdgesOfTheMapsAsDocumented) {
  const uint32_t centers[] = {0x38800000u, 0x38000800u, 0x38000000u, 0x37800000u,
                              0x38880000u, 0x38840000u, 0x3f780000u, 0x3f7c0000u,
                              0x3f7ffff0u, 0x3e900000u, 0x00000003u, 0x00800000u};
  std::vector<float> g(kInt8StateBlock + 300, 0.0f);
  size_t i = 0;
  for (size_t block : {size_t(0), size_t(1)}) {
    g[block * kInt8StateBlock] = 1.0f;  // the absmax
    i = block * kInt8StateBlock + 1;
    for (uint32_t c : centers) {
      for (int d = -3; d <= 3; ++d) {
        const float x = test::FromBits(c + uint32_t(d));
        g[i++] = x;
        g[i++] = -x;
      }
    }
  }
  g[i] = -0.0f;
  AdamHyperParams h;
  h.lr = 0.0;
  h.beta1 = 0.0;
  h.beta2 = 0.0;
  h.step = 1;
  for (CpuIsa isa : test::SupportedIsas()) {
    for (StateRounding rounding : {StateRounding::kNearestEven, StateRounding::kStochastic}) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " " + StateRoundingName(rounding));
      ExpectTheFp32StepRequantized(RandomState(g.size(), 3), g, h, 1.0f, ParamOut::kBf16, rounding,
                                   isa);
    }
  }
}

// Steps 1..3, each on `isa` with `threads`; a multi-block slice with a partial last block.
State RunSteps(size_t n, CpuIsa isa, int threads, FloatFormat grad_format) {
  State s = RandomState(n, 42);
  CpuKernelOptions opt;
  opt.isa = isa;
  opt.threads = threads;
  std::vector<uint16_t> copy(n);
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g32 = Grad(n, t);
    std::vector<uint16_t> g16(n);
    for (size_t i = 0; i < n; ++i) g16[i] = FloatToBf16(g32[i]);
    AdamSlice sl = Int8Slice(&s, g32.data(), n, 0x1234567890abcdefull + uint64_t(t));
    if (grad_format == FloatFormat::kBf16) sl.grad = g16.data(), sl.grad_format = grad_format;
    sl.param_out = copy.data();
    sl.param_out_format = ParamOut::kBf16;
    AdamHyperParams h = Hyper(t);
    if (t == 2) h.mode = AdamMode::kAdam;
    if (t == 3) sl.state_rounding = StateRounding::kNearestEven;
    const Status st = AdamStep(sl, h, 0.75f, opt);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return s;
}

TEST(AdamInt8StateTest, SameBitsOnEveryIsaAndThreadCount) {
  for (FloatFormat gf : {FloatFormat::kFp32, FloatFormat::kBf16}) {
    for (size_t n : {size_t(17), size_t(4099), size_t(100003)}) {
      const State ref = RunSteps(n, CpuIsa::kScalar, 1, gf);
      for (CpuIsa isa : test::SupportedIsas()) {
        for (int threads : {1, 3}) {
          const std::string where = std::string("isa ") + CpuIsaName(isa) + " threads " +
                                    std::to_string(threads) + " n " + std::to_string(n) + " grad " +
                                    FloatFormatName(gf);
          const State got = RunSteps(n, isa, threads, gf);
          ASSERT_EQ(test::FirstBitDifference(got.p.data(), ref.p.data(), n), -1) << where;
          ASSERT_EQ(test::FirstBitDifference(got.m.data(), ref.m.data(), n), -1) << where;
          ASSERT_EQ(test::FirstBitDifference(got.v.data(), ref.v.data(), n), -1) << where;
          const size_t nb = Int8StateBlocks(n);
          ASSERT_EQ(test::FirstBitDifference(got.m_scale.data(), ref.m_scale.data(), nb), -1);
          ASSERT_EQ(test::FirstBitDifference(got.v_scale.data(), ref.v_scale.data(), nb), -1);
        }
      }
    }
  }
}

// Non-finite gradients (NaN of either sign, infinities) saturate the codes of their blocks
// (optim.h: NaN and infinity code 0xff, a negative NaN's sqrt(exp_avg_sq) 0) the same way on
// every ISA: AVX2 saturates in its packs, the others in Int8Code. Blocks 0 and 2 hold them,
// block 1 stays finite; the last block is partial (a tail after the four-vector loops).
TEST(AdamInt8StateTest, NonFiniteGradientsGiveTheSameCodesOnEveryIsa) {
  const size_t n = 2 * kInt8StateBlock + 77;
  std::vector<float> g = Grad(n, 4);
  const float inf = std::numeric_limits<float>::infinity();
  g[5] = test::FromBits(0x7fc00000u);                        // NaN
  g[2 * kInt8StateBlock + 9] = test::FromBits(0xffc00000u);  // negative NaN (x86's default)
  g[2 * kInt8StateBlock + 40] = inf;
  g[2 * kInt8StateBlock + 41] = -inf;
  auto run = [&](CpuIsa isa) {
    State s = RandomState(n, 11);
    CpuKernelOptions opt;
    opt.isa = isa;
    AdamSlice sl = Int8Slice(&s, g.data(), n, 99);
    sl.state_rounding = StateRounding::kNearestEven;
    EXPECT_TRUE(AdamStep(sl, Hyper(2), 1.0f, opt).ok());
    return s;
  };
  const State ref = run(CpuIsa::kScalar);
  EXPECT_TRUE(std::isnan(ref.m_scale[0]) && std::isnan(ref.m_scale[2]));
  EXPECT_TRUE(std::isfinite(ref.m_scale[1]) && std::isfinite(ref.v_scale[1]));
  EXPECT_EQ(ref.m[5], 0xff);
  for (CpuIsa isa : test::SupportedIsas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    const State got = run(isa);
    EXPECT_EQ(got.m, ref.m);
    EXPECT_EQ(got.v, ref.v);
    EXPECT_EQ(test::FirstBitDifference(got.p.data(), ref.p.data(), n), -1);
    EXPECT_EQ(test::FirstBitDifference(got.m_scale.data(), ref.m_scale.data(), 3), -1);
    EXPECT_EQ(test::FirstBitDifference(got.v_scale.data(), ref.v_scale.data(), 3), -1);
  }
}

uint64_t Fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

uint64_t HashOf(const State& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = Fnv1a(h, s.p.data(), s.p.size() * 4);
  h = Fnv1a(h, s.m.data(), s.m.size());
  h = Fnv1a(h, s.v.data(), s.v.size());
  h = Fnv1a(h, s.m_scale.data(), s.m_scale.size() * 4);
  return Fnv1a(h, s.v_scale.data(), s.v_scale.size() * 4);
}

// The kernel's bits are pinned: a faster rewrite must keep every output bit. Recorded from
// the kernel with the folded moments (Int8Moments: the scales folded into the constants) and
// sqrt(exp_avg_sq)'s random bits h >> 13, which changed them on purpose; before, the folded
// update's (b4a2bc1..f95c5f6) were 0xc94e579059c5bdef and 0x2e4eedc088219990, the first
// kernel's (449e88e..16f4df0) 0x12d196aaec1f0639 and 0x6c55444fc9e25e1b.
TEST(AdamInt8StateTest, SameBitsAsTheRecordedKernel) {
  const uint64_t want_fp32 = 0x6a7d4ab89e8fe40dull, want_bf16 = 0xc47df9a7e38b9527ull;
  for (CpuIsa isa : test::SupportedIsas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    EXPECT_EQ(HashOf(RunSteps(100003, isa, 2, FloatFormat::kFp32)), want_fp32);
    EXPECT_EQ(HashOf(RunSteps(100003, isa, 2, FloatFormat::kBf16)), want_bf16);
  }
}

// Nearest rounding: exp_avg within 1/16 of itself (3 fraction bits), sqrt(exp_avg_sq) within
// 1/32, down to 2^-14 of the block's absmax; below, exp_avg within 2^-15 of the absmax and a
// non-zero exp_avg_sq never 0.
TEST(AdamInt8StateTest, ConversionRoundTripsWithinTheMapsPrecision) {
  const size_t n = 2 * kInt8StateBlock + 5;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-20.0f, 0.0f);
  std::vector<float> m(n), v(n), m2(n), v2(n);
  for (size_t i = 0; i < n; ++i) {
    m[i] = (i % 2 ? -1.0f : 1.0f) * std::exp2(expo(rng));
    v[i] = std::exp2(2.0f * expo(rng));
  }
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ms(3), vs(3);
  ASSERT_TRUE(
      QuantizeInt8Moments(m.data(), v.data(), n, mc.data(), vc.data(), ms.data(), vs.data()).ok());
  ASSERT_TRUE(
      DequantizeInt8Moments(mc.data(), vc.data(), ms.data(), vs.data(), n, m2.data(), v2.data())
          .ok());
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kInt8StateBlock;
    if (std::fabs(m[i]) >= ms[b] * 0x1p-14f) {
      ASSERT_LE(std::fabs(m2[i] - m[i]), std::fabs(m[i]) / 16.0f * 1.001f) << i;
    } else {
      ASSERT_LE(std::fabs(m2[i] - m[i]), ms[b] * 0x1p-15f * 1.001f) << i;
    }
    const float u = std::sqrt(v[i]), u2 = std::sqrt(v2[i]);
    if (u >= vs[b] * 0x1p-14f) {
      ASSERT_LE(std::fabs(u2 - u), u / 32.0f * 1.001f) << i;
    }
    // The decoded values are the documented ones.
    ASSERT_EQ(test::Bits(m2[i]), test::Bits(CodeValue(mc[i], 3, true, ms[b]))) << i;
    const float root = CodeValue(vc[i], 4, false, vs[b]);
    ASSERT_EQ(test::Bits(v2[i]), test::Bits(root * root)) << i;
    ASSERT_GT(v2[i], 0.0f) << i;
  }
}

// A gradient far below sqrt(v): exp_avg_sq must decay by 0.1% a step, 16x below a code step.
TEST(AdamInt8StateTest, StochasticRoundingFollowsTheDecayOfExpAvgSq) {
  const size_t n = 4 * kInt8StateBlock;
  std::vector<float> v32(n, 1.0f), m32(n, 0.0f), p32(n, 0.0f), zero(n, 0.0f);
  State s{std::vector<float>(n), std::vector<uint8_t>(n), std::vector<uint8_t>(n),
          std::vector<float>(4), std::vector<float>(4)};
  ASSERT_TRUE(QuantizeInt8Moments(m32.data(), v32.data(), n, s.m.data(), s.v.data(),
                                  s.m_scale.data(), s.v_scale.data())
                  .ok());
  const std::vector<float> g(n, 0.1f);
  for (int64_t t = 1; t <= 500; ++t) {
    AdamHyperParams h = Hyper(t);
    h.lr = 0;
    AdamSlice a;
    a.grad = g.data();
    a.n = n;
    a.master = p32.data();
    a.exp_avg = m32.data();
    a.exp_avg_sq = v32.data();
    ASSERT_TRUE(AdamStep(a, h, 1.0f).ok());
    ASSERT_TRUE(AdamStep(Int8Slice(&s, g.data(), n, uint64_t(t)), h, 1.0f).ok());
  }
  std::vector<float> m8(n), v8(n);
  ASSERT_TRUE(DequantizeInt8Moments(s.m.data(), s.v.data(), s.m_scale.data(), s.v_scale.data(), n,
                                    m8.data(), v8.data())
                  .ok());
  double mean32 = 0, mean8 = 0, mean_m = 0;
  for (size_t i = 0; i < n; ++i) mean32 += v32[i], mean8 += v8[i], mean_m += m8[i];
  mean32 /= n, mean8 /= n, mean_m /= n;
  EXPECT_NEAR(mean32, 0.01 + 0.99 * std::pow(0.999, 500), 1e-4);  // 0.61
  EXPECT_NEAR(mean8, mean32, 0.01 * mean32);
  EXPECT_NEAR(mean_m, m32[0], 0.01 * m32[0]);
}

// Minimise sum((p - target)^2 * weight) over weights spanning 6 decades: int8 states end
// within a few percent of the fp32 states' loss.
TEST(AdamInt8StateTest, TrainsAQuadraticLikeFp32States) {
  const size_t n = 3 * kInt8StateBlock + 100;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> target(n), weight(n);
  for (size_t i = 0; i < n; ++i) {
    target[i] = normal(rng);
    weight[i] = std::pow(10.0f, -float(i % 7));
  }
  auto loss = [&](const std::vector<float>& p) {
    double l = 0;
    for (size_t i = 0; i < n; ++i) l += double(weight[i]) * (p[i] - target[i]) * (p[i] - target[i]);
    return l;
  };
  std::vector<float> p32(n, 0.0f), m32(n, 0.0f), v32(n, 0.0f), g(n);
  State s{std::vector<float>(n, 0.0f), std::vector<uint8_t>(n), std::vector<uint8_t>(n),
          std::vector<float>(Int8StateBlocks(n)), std::vector<float>(Int8StateBlocks(n))};
  const double start = loss(p32);
  for (int64_t t = 1; t <= 300; ++t) {
    AdamHyperParams h = Hyper(t);
    h.lr = 1e-2;
    h.weight_decay = 0;
    for (size_t i = 0; i < n; ++i)
      g[i] = 2.0f * weight[i] * (p32[i] - target[i]) + 0.01f * normal(rng) * weight[i];
    AdamSlice a;
    a.grad = g.data();
    a.n = n;
    a.master = p32.data();
    a.exp_avg = m32.data();
    a.exp_avg_sq = v32.data();
    ASSERT_TRUE(AdamStep(a, h, 1.0f).ok());
    for (size_t i = 0; i < n; ++i)
      g[i] = 2.0f * weight[i] * (s.p[i] - target[i]) + 0.01f * normal(rng) * weight[i];
    ASSERT_TRUE(AdamStep(Int8Slice(&s, g.data(), n, uint64_t(t)), h, 1.0f).ok());
  }
  const double l32 = loss(p32), l8 = loss(s.p);
  EXPECT_LT(l32, 0.05 * start);
  EXPECT_LT(std::fabs(l8 - l32), 0.05 * l32 + 1e-6 * start) << "fp32 " << l32 << " int8 " << l8;
}

TEST(AdamInt8StateTest, ArgumentChecksAndSizes) {
  float p[4] = {}, g[4] = {}, ms[1] = {}, vs[1] = {};
  uint8_t m[4] = {}, v[4] = {};
  AdamSlice s;
  s.master = p;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  s.grad = g;
  s.n = 4;
  s.state_format = StateFormat::kInt8;
  EXPECT_EQ(AdamStep(s, Hyper(1), 1.0f).code(), StatusCode::kInvalidArgument);  // no scales
  s.exp_avg_scale = ms;
  s.exp_avg_sq_scale = vs;
  EXPECT_TRUE(AdamStep(s, Hyper(1), 1.0f).ok());
  s.exp_avg_sq = m + 2;  // overlaps exp_avg by 2 codes
  EXPECT_EQ(AdamStep(s, Hyper(1), 1.0f).code(), StatusCode::kInvalidArgument);
  s.exp_avg_sq = v;
  s.exp_avg_sq_scale = ms;
  EXPECT_EQ(AdamStep(s, Hyper(1), 1.0f).code(), StatusCode::kInvalidArgument);
  s.exp_avg_sq_scale = vs;
  AdamHyperParams torch = Hyper(1);
  torch.mode = AdamMode::kAdamWTorch;
  EXPECT_EQ(AdamStep(s, torch, 1.0f).code(), StatusCode::kNotSupported);
  EXPECT_EQ(AdamBytesPerParam(FloatFormat::kFp32, ParamOut::kNone, StateFormat::kInt8), 16u);
  EXPECT_EQ(*ParseStateFormat("int8"), StateFormat::kInt8);
  EXPECT_STREQ(StateFormatName(StateFormat::kInt8), "int8");
  EXPECT_FALSE(ParseStateFormat("int4").ok());
  EXPECT_EQ(Int8StateBlocks(0), 0u);
  EXPECT_EQ(Int8StateBlocks(2049), 2u);
  // The bound kernel leaves int8 states as they were.
  std::vector<uint8_t> m0(m, m + 4), v0(v, v + 4);
  const float ms0 = ms[0];
  EXPECT_TRUE(AdamTrafficStep(s).ok());
  EXPECT_EQ(std::vector<uint8_t>(m, m + 4), m0);
  EXPECT_EQ(std::vector<uint8_t>(v, v + 4), v0);
  EXPECT_EQ(ms[0], ms0);
}

}  // namespace
}  // namespace strata
