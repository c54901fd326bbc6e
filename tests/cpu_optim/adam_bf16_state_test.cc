// AdamStep with bf16 moments (StateFormat::kBf16): each step equals the fp32-state step on
// the widened moments with m and v rounded as documented (nearest-even, or stochastic with
// the hash bits of include/strata/optim.h, recomputed here from the formula), bit for bit on
// every ISA and thread count, independent of how an array is cut into slices; and
// stochastic rounding keeps the small per-step increments of exp_avg_sq that nearest-even
// loses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "strata/optim.h"
#include "tests/cpu_optim/test_util.h"

namespace strata {
namespace {

using test::Mix32;

// What a stochastic store of `x` gives with `add` random bits (NaN aside).
uint16_t Stochastic(float x, uint32_t add) { return uint16_t((test::Bits(x) + add) >> 16); }

struct State {
  std::vector<float> p;
  std::vector<uint16_t> m, v;
};

State RandomState(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s{std::vector<float>(n), std::vector<uint16_t>(n), std::vector<uint16_t>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng);
    s.m[i] = FloatToBf16(0.1f * normal(rng));
    s.v[i] = FloatToBf16(0.01f * std::fabs(normal(rng)));
  }
  return s;
}

std::vector<float> Grad(size_t n, int64_t step) {
  std::mt19937 rng(uint32_t(n * 7 + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = (i % 11 == 0) ? 0.0f : normal(rng) * 0.3f;
  return g;
}

AdamHyperParams Hyper(int64_t step) {
  AdamHyperParams h;
  h.lr = 3e-3;
  h.weight_decay = 0.05;
  h.step = step;
  return h;
}

// Steps 1..3 over [0, n) in slices of `cut` elements (index_base = the slice's start).
State RunSteps(size_t n, StateRounding rounding, CpuIsa isa, int threads, size_t cut) {
  State s = RandomState(n, 42);
  CpuKernelOptions opt;
  opt.isa = isa;
  opt.threads = threads;
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g = Grad(n, t);
    for (size_t lo = 0; lo < n; lo += cut) {
      AdamSlice sl;
      sl.master = s.p.data() + lo;
      sl.exp_avg = s.m.data() + lo;
      sl.exp_avg_sq = s.v.data() + lo;
      sl.grad = g.data() + lo;
      sl.n = std::min(cut, n - lo);
      sl.state_format = StateFormat::kBf16;
      sl.state_rounding = rounding;
      sl.rounding_key = 0x1234567890abcdefull + uint64_t(t);
      sl.index_base = lo;
      const Status st = AdamStep(sl, Hyper(t), 0.75f, opt);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
  }
  return s;
}

// One step against the fp32-state kernel on the widened moments.
TEST(AdamBf16StateTest, EqualsTheFp32StepWithMomentsRoundedAsDocumented) {
  for (StateRounding rounding : {StateRounding::kNearestEven, StateRounding::kStochastic}) {
    for (size_t n : {size_t(1), size_t(15), size_t(17), size_t(1023), size_t(70000)}) {
      SCOPED_TRACE(std::string(StateRoundingName(rounding)) + " n " + std::to_string(n));
      State s = RandomState(n, uint32_t(n));
      std::vector<float> p32 = s.p, m32(n), v32(n);
      for (size_t i = 0; i < n; ++i) {
        m32[i] = Bf16ToFloat(s.m[i]);
        v32[i] = Bf16ToFloat(s.v[i]);
      }
      const std::vector<float> g = Grad(n, 5);
      const uint64_t key = 0xfeedface12345678ull, base = 1000;
      AdamSlice ref;
      ref.master = p32.data();
      ref.exp_avg = m32.data();
      ref.exp_avg_sq = v32.data();
      ref.grad = g.data();
      ref.n = n;
      ASSERT_TRUE(AdamStep(ref, Hyper(5), 0.5f).ok());
      AdamSlice sl = ref;
      sl.master = s.p.data();
      sl.exp_avg = s.m.data();
      sl.exp_avg_sq = s.v.data();
      sl.state_format = StateFormat::kBf16;
      sl.state_rounding = rounding;
      sl.rounding_key = key;
      sl.index_base = base;
      ASSERT_TRUE(AdamStep(sl, Hyper(5), 0.5f).ok());
      const uint32_t k = Mix32(uint32_t(key ^ (key >> 32)));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(test::Bits(s.p[i]), test::Bits(p32[i])) << "master " << i;
        uint16_t want_m = FloatToBf16(m32[i]), want_v = FloatToBf16(v32[i]);
        if (rounding == StateRounding::kStochastic) {
          const uint32_t h = Mix32(uint32_t(base + i) + k);
          want_m = Stochastic(m32[i], h & 0xffffu);
          want_v = Stochastic(v32[i], h >> 16);
        }
        ASSERT_EQ(s.m[i], want_m) << "exp_avg " << i;
        ASSERT_EQ(s.v[i], want_v) << "exp_avg_sq " << i;
      }
    }
  }
}

TEST(AdamBf16StateTest, SameBitsOnEveryIsaThreadCountAndSlicing) {
  for (StateRounding rounding : {StateRounding::kNearestEven, StateRounding::kStochastic}) {
    for (size_t n : {size_t(17), size_t(4099), size_t(100003)}) {
      const State ref = RunSteps(n, rounding, CpuIsa::kScalar, 1, n);
      for (CpuIsa isa : test::SupportedIsas()) {
        for (int threads : {1, 3}) {
          for (size_t cut : {n, size_t(1000), size_t(37)}) {
            const std::string where = std::string(StateRoundingName(rounding)) + " isa " +
                                      CpuIsaName(isa) + " threads " + std::to_string(threads) +
                                      " n " + std::to_string(n) + " cut " + std::to_string(cut);
            const State got = RunSteps(n, rounding, isa, threads, cut);
            ASSERT_EQ(test::FirstBitDifference(got.p.data(), ref.p.data(), n), -1) << where;
            ASSERT_EQ(test::FirstBitDifference(got.m.data(), ref.m.data(), n), -1) << where;
            ASSERT_EQ(test::FirstBitDifference(got.v.data(), ref.v.data(), n), -1) << where;
          }
        }
      }
    }
  }
}

// A gradient that shrinks 10x: exp_avg_sq must decay by 0.1% a step. Below half a bf16 ulp
// (0.2%) nearest-even loses every decrement; stochastic rounding follows fp32 on average.
TEST(AdamBf16StateTest, StochasticRoundingKeepsIncrementsBelowHalfAnUlp) {
  const size_t n = 4096;
  std::vector<float> v32(n, 1.0f);
  std::vector<uint16_t> v_rne(n, FloatToBf16(1.0f)), v_sr(n, FloatToBf16(1.0f));
  std::vector<float> p(n, 0.0f), m32(n, 0.0f), p2 = p, p3 = p;
  std::vector<uint16_t> m_rne(n, 0), m_sr(n, 0);
  const std::vector<float> g(n, 0.1f);  // g^2 = 0.01, far below v
  for (int64_t t = 1; t <= 500; ++t) {
    AdamHyperParams h = Hyper(t);
    h.lr = 0;
    AdamSlice a;
    a.grad = g.data();
    a.n = n;
    a.master = p.data();
    a.exp_avg = m32.data();
    a.exp_avg_sq = v32.data();
    ASSERT_TRUE(AdamStep(a, h, 1.0f).ok());
    a.state_format = StateFormat::kBf16;
    a.rounding_key = uint64_t(t);
    a.state_rounding = StateRounding::kNearestEven;
    a.master = p2.data();
    a.exp_avg = m_rne.data();
    a.exp_avg_sq = v_rne.data();
    ASSERT_TRUE(AdamStep(a, h, 1.0f).ok());
    a.state_rounding = StateRounding::kStochastic;
    a.master = p3.data();
    a.exp_avg = m_sr.data();
    a.exp_avg_sq = v_sr.data();
    ASSERT_TRUE(AdamStep(a, h, 1.0f).ok());
  }
  double mean32 = 0, mean_rne = 0, mean_sr = 0;
  for (size_t i = 0; i < n; ++i) {
    mean32 += v32[i];
    mean_rne += Bf16ToFloat(v_rne[i]);
    mean_sr += Bf16ToFloat(v_sr[i]);
  }
  mean32 /= n, mean_rne /= n, mean_sr /= n;
  EXPECT_NEAR(mean32, 0.01 + 0.99 * std::pow(0.999, 500), 1e-4);  // 0.61
  EXPECT_EQ(mean_rne, 1.0) << "nearest-even was expected to lose every decrement";
  EXPECT_NEAR(mean_sr, mean32, 0.01 * mean32);
}

TEST(AdamBf16StateTest, ArgumentChecks) {
  float p[4] = {}, g[4] = {};
  uint16_t m[4] = {}, v[4] = {};
  AdamSlice s;
  s.master = p;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  s.grad = g;
  s.n = 4;
  s.state_format = StateFormat::kBf16;
  EXPECT_TRUE(AdamStep(s, Hyper(1), 1.0f).ok());
  s.state_format = StateFormat(7);
  EXPECT_EQ(AdamStep(s, Hyper(1), 1.0f).code(), StatusCode::kInvalidArgument);
  s.state_format = StateFormat::kBf16;
  s.exp_avg_sq = m + 2;  // overlaps exp_avg by 2 bf16 elements
  EXPECT_EQ(AdamStep(s, Hyper(1), 1.0f).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamBytesPerParam(FloatFormat::kFp32, ParamOut::kNone, StateFormat::kBf16) + 8,
            AdamBytesPerParam(FloatFormat::kFp32, ParamOut::kNone, StateFormat::kFp32));
}

}  // namespace
}  // namespace strata
