// AdamStep against a float64 reference, bit-identity across ISAs / thread counts /
// lengths / alignments, and argument checking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "strata/optim.h"
#include "tests/cpu_optim/test_util.h"

namespace strata {
namespace {

using test::OffsetBuffer;

// ---------------------------------------------------------------------------------------
// Accuracy against float64.
//
// Each of 100 steps is checked on its own: the reference takes the kernel's fp32 state
// before the step (exactly representable in double), applies torch's formula in double
// with the double hyper-parameters, and the kernel's new master/exp_avg/exp_avg_sq must
// agree element-wise to 1e-6 relative. Comparing two free-running trajectories instead
// would measure how float32 rounding accumulates over 100 steps, a property of float32
// rather than of the kernel; seeding every step from the kernel's state isolates the
// kernel's own error while still covering the bias corrections of t = 1..100.
//
// Relative error: |kernel - ref| <= 1e-6 * mag, where mag is the sum of the absolute
// values of the terms that produce the result (|b1*m| + |(1-b1)*g| for exp_avg, and so on,
// propagated through the formula). mag == |ref| when nothing cancels, so this is the
// usual relative error; when terms cancel (exp_avg crossing zero) it is the error that a
// correctly rounded evaluation can guarantee, instead of a meaningless ratio near 0/0.
// ---------------------------------------------------------------------------------------

struct RefResult {
  double p, m, v;
  double p_mag, m_mag, v_mag;
};

RefResult ReferenceStep(double p, double m, double v, double g, double scale,
                        const AdamHyperParams& h) {
  const double t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, t));
  g *= scale;
  double g_mag = std::fabs(g);
  if (h.mode == AdamMode::kAdam) {
    g += h.weight_decay * p;
    g_mag += h.weight_decay * std::fabs(p);
  }
  RefResult r;
  r.m = h.beta1 * m + (1.0 - h.beta1) * g;
  r.m_mag = h.beta1 * std::fabs(m) + (1.0 - h.beta1) * g_mag;
  r.v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  r.v_mag = h.beta2 * v + (1.0 - h.beta2) * g_mag * g_mag;
  const double denom = std::sqrt(r.v) / bc2_sqrt + h.eps;
  const double denom_mag = std::sqrt(r.v_mag) / bc2_sqrt + h.eps;
  const double ratio = r.m / denom;
  const double ratio_mag = r.m_mag / denom + std::fabs(ratio) * denom_mag / denom;
  const double step_size = h.lr / bc1;
  const double decayed = h.mode == AdamMode::kAdamW ? p * (1.0 - h.lr * h.weight_decay) : p;
  r.p = decayed - step_size * ratio;
  r.p_mag = std::fabs(decayed) + step_size * ratio_mag;
  return r;
}

float GradValue(const void* grad, FloatFormat f, size_t i) {
  switch (f) {
    case FloatFormat::kFp32:
      return static_cast<const float*>(grad)[i];
    case FloatFormat::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(grad)[i]);
    case FloatFormat::kFp16:
      return Fp16ToFloat(static_cast<const uint16_t*>(grad)[i]);
  }
  return 0;
}

struct AccuracyCase {
  AdamMode mode;
  double weight_decay;
  FloatFormat grad_format;
};

class AdamAccuracyTest : public ::testing::TestWithParam<AccuracyCase> {};

TEST_P(AdamAccuracyTest, HundredStepsWithinOneMillionthOfFloat64) {
  const AccuracyCase c = GetParam();
  for (CpuIsa isa : test::SupportedIsas()) {
    const size_t n = 1031;
    const uint32_t seed = 1234 + static_cast<uint32_t>(isa);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g32(n);
    std::vector<uint16_t> g16(n);
    for (float& x : p) x = normal(rng);
    AdamHyperParams h;
    h.lr = 1e-2;  // large enough that every step moves the weights visibly
    h.weight_decay = c.weight_decay;
    h.mode = c.mode;
    CpuKernelOptions opt;
    opt.isa = isa;
    double worst[3] = {0, 0, 0};
    for (int64_t t = 1; t <= 100; ++t) {
      h.step = t;
      const float scale = (t % 3 == 0) ? 0.25f : 1.0f;  // unscale x clip on some steps
      for (size_t i = 0; i < n; ++i) {
        // A drifting mean makes exp_avg cross zero now and then (the cancellation case).
        float x = normal(rng) * (i % 7 == 0 ? 1e-3f : 1.0f) + 0.3f * std::sin(0.1f * t + i);
        if (c.grad_format == FloatFormat::kFp32) g32[i] = x;
        if (c.grad_format == FloatFormat::kBf16) g16[i] = FloatToBf16(x);
        if (c.grad_format == FloatFormat::kFp16) g16[i] = FloatToFp16(x);
      }
      const void* grad =
          c.grad_format == FloatFormat::kFp32 ? static_cast<const void*>(g32.data()) : g16.data();
      std::vector<RefResult> ref(n);
      for (size_t i = 0; i < n; ++i) {
        ref[i] = ReferenceStep(p[i], m[i], v[i], GradValue(grad, c.grad_format, i), scale, h);
      }
      AdamSlice s;
      s.master = p.data();
      s.exp_avg = m.data();
      s.exp_avg_sq = v.data();
      s.grad = grad;
      s.grad_format = c.grad_format;
      s.n = n;
      ASSERT_TRUE(AdamStep(s, h, scale, opt).ok());
      for (size_t i = 0; i < n; ++i) {
        const double err[3] = {std::fabs(p[i] - ref[i].p) / ref[i].p_mag,
                               std::fabs(m[i] - ref[i].m) / ref[i].m_mag,
                               ref[i].v_mag > 0 ? std::fabs(v[i] - ref[i].v) / ref[i].v_mag : 0};
        for (int k = 0; k < 3; ++k) {
          worst[k] = std::max(worst[k], err[k]);
          ASSERT_LE(err[k], 1e-6) << "isa " << CpuIsaName(isa) << " step " << t << " element " << i
                                  << " array " << k << " (0 master, 1 exp_avg, 2 "
                                  << "exp_avg_sq) kernel p/m/v " << p[i] << "/" << m[i] << "/"
                                  << v[i] << " ref " << ref[i].p << "/" << ref[i].m << "/"
                                  << ref[i].v << " seed " << seed;
        }
      }
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", std::max({worst[0], worst[1], worst[2]}));
    RecordProperty(std::string("worst_rel_err_") + CpuIsaName(isa), buf);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AdamAccuracyTest,
                         ::testing::Values(AccuracyCase{AdamMode::kAdamW, 0.0, FloatFormat::kFp32},
                                           AccuracyCase{AdamMode::kAdamW, 0.1, FloatFormat::kFp32},
                                           AccuracyCase{AdamMode::kAdam, 0.0, FloatFormat::kFp32},
                                           AccuracyCase{AdamMode::kAdam, 0.1, FloatFormat::kFp32},
                                           AccuracyCase{AdamMode::kAdamW, 0.1, FloatFormat::kBf16},
                                           AccuracyCase{AdamMode::kAdam, 0.1, FloatFormat::kFp16}));

// The two trajectories also run independently for 100 steps: the float32 one (the kernel)
// and the float64 one (the reference, fed the same gradients). Here rounding accumulates
// and 1e-6 is not attainable by any float32 optimizer: storing p in float32 costs up to
// half an ulp (2^-24 relative) per step (the kernel rounds p once per step), and with Adam's nearly
// constant step size those roundings repeat with the same sign (measured: 1.1e-6 after 18 steps).
// So the bound is the float32 storage bound, 2^-24 per step (+25% for the update's own ~1e-7 error
// x lr), on |p_kernel - p_ref| / max(|p_ref|, 1). A wrong formula (bias correction, decay) exceeds
// it at once.
TEST(AdamAccuracyTest, FreeRunningTrajectoryDriftsAtMostHalfUlpPerStep) {
  for (AdamMode mode : {AdamMode::kAdamW, AdamMode::kAdam}) {
    const size_t n = 4099;
    std::mt19937 rng(99);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
    for (float& x : p) x = normal(rng);
    std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
    AdamHyperParams h;
    h.weight_decay = 0.01;
    h.mode = mode;
    double worst = 0;
    for (int64_t t = 1; t <= 100; ++t) {
      h.step = t;
      for (size_t i = 0; i < n; ++i) g[i] = normal(rng) + 0.2f * std::sin(0.05f * t * (i % 11));
      AdamSlice s{p.data(),           m.data(), v.data(),        g.data(),
                  FloatFormat::kFp32, nullptr,  ParamOut::kNone, n};
      ASSERT_TRUE(AdamStep(s, h, 1.0f).ok());
      for (size_t i = 0; i < n; ++i) {
        const RefResult r = ReferenceStep(rp[i], rm[i], rv[i], g[i], 1.0, h);
        rp[i] = r.p;
        rm[i] = r.m;
        rv[i] = r.v;
        const double err = std::fabs(p[i] - rp[i]) / std::max(std::fabs(rp[i]), 1.0);
        worst = std::max(worst, err);
        ASSERT_LE(err, 1.25 * std::ldexp(1.0, -24) * static_cast<double>(t))
            << "step " << t << " element " << i << ": " << p[i] << " vs " << rp[i];
      }
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", worst);
    RecordProperty(mode == AdamMode::kAdamW ? "worst_drift_adamw" : "worst_drift_adam", buf);
  }
}

// A deliberately wrong reference must fail the same check (the test can fail): the
// reference without bias correction differs by far more than 1e-6 at step 1.
TEST(AdamAccuracyTest, CheckDetectsMissingBiasCorrection) {
  AdamHyperParams h;
  h.lr = 1e-2;
  float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
  AdamSlice s{&p, &m, &v, &g, FloatFormat::kFp32, nullptr, ParamOut::kNone, 1};
  const RefResult right = ReferenceStep(1.0, 0.0, 0.0, 0.5, 1.0, h);
  ASSERT_TRUE(AdamStep(s, h, 1.0f).ok());
  EXPECT_LE(std::fabs(p - right.p) / right.p_mag, 1e-6);
  const double no_bias_correction = 1.0 - h.lr * (0.1 * 0.5) / (std::sqrt(0.001 * 0.25) + 1e-8);
  EXPECT_GT(std::fabs(p - no_bias_correction) / right.p_mag, 1e-6);
}

// ---------------------------------------------------------------------------------------
// Bit identity across ISAs, thread counts, lengths and alignments.
// ---------------------------------------------------------------------------------------

struct StepOutput {
  std::vector<float> p, m, v;
  std::vector<uint16_t> out;
};

struct IdentityCase {
  size_t n;
  size_t offset;  // each array is offset differently from this base
  FloatFormat grad_format;
  ParamOut out;
  AdamMode mode;
};

StepOutput RunSteps(const IdentityCase& c, CpuIsa isa, int threads) {
  const size_t n = c.n;
  OffsetBuffer<float> p(n, c.offset % 16), m(n, (c.offset + 1) % 16), v(n, (c.offset + 5) % 16),
      g32(n, (c.offset + 7) % 16);
  OffsetBuffer<uint16_t> g16(n, (c.offset + 3) % 32), out(n, (c.offset + 11) % 32);
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + c.offset));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    m[i] = 0.1f * normal(rng);
    v[i] = 0.01f * std::fabs(normal(rng));
  }
  AdamHyperParams h;
  h.lr = 3e-3;
  h.weight_decay = 0.05;
  h.mode = c.mode;
  CpuKernelOptions opt;
  opt.isa = isa;
  opt.threads = threads;
  for (int64_t t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i) {
      const float x = (i % 13 == 0) ? 0.0f : normal(rng) * std::ldexp(1.0f, (int)(i % 9) - 4);
      g32[i] = x;
      g16[i] = c.grad_format == FloatFormat::kBf16 ? FloatToBf16(x) : FloatToFp16(x);
    }
    h.step = t;
    AdamSlice s;
    s.master = p.data();
    s.exp_avg = m.data();
    s.exp_avg_sq = v.data();
    s.grad =
        c.grad_format == FloatFormat::kFp32 ? static_cast<const void*>(g32.data()) : g16.data();
    s.grad_format = c.grad_format;
    s.param_out = c.out == ParamOut::kNone ? nullptr : out.data();
    s.param_out_format = c.out;
    s.n = n;
    Status st = AdamStep(s, h, 0.75f, opt);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  StepOutput r;
  r.p.assign(p.data(), p.data() + n);
  r.m.assign(m.data(), m.data() + n);
  r.v.assign(v.data(), v.data() + n);
  if (c.out != ParamOut::kNone) r.out.assign(out.data(), out.data() + n);
  return r;
}

void ExpectIdentical(const IdentityCase& c) {
  const StepOutput ref = RunSteps(c, CpuIsa::kScalar, 1);
  // The copy is the rounded master, bit for bit.
  for (size_t i = 0; i < ref.out.size(); ++i) {
    const uint16_t want = c.out == ParamOut::kBf16 ? FloatToBf16(ref.p[i]) : FloatToFp16(ref.p[i]);
    ASSERT_EQ(ref.out[i], want) << "param_out element " << i;
  }
  for (CpuIsa isa : test::SupportedIsas()) {
    for (int threads : {1, 2, 3, 7}) {
      const StepOutput got = RunSteps(c, isa, threads);
      const std::string where = std::string("isa ") + CpuIsaName(isa) + " threads " +
                                std::to_string(threads) + " n " + std::to_string(c.n) + " offset " +
                                std::to_string(c.offset) + " grad " +
                                FloatFormatName(c.grad_format) + " out " + ParamOutName(c.out) +
                                (c.mode == AdamMode::kAdamW  ? " adamw"
                                 : c.mode == AdamMode::kAdam ? " adam"
                                                             : " adamw-torch");
      ASSERT_EQ(test::FirstBitDifference(got.p.data(), ref.p.data(), c.n), -1) << where;
      ASSERT_EQ(test::FirstBitDifference(got.m.data(), ref.m.data(), c.n), -1) << where;
      ASSERT_EQ(test::FirstBitDifference(got.v.data(), ref.v.data(), c.n), -1) << where;
      ASSERT_EQ(test::FirstBitDifference(got.out.data(), ref.out.data(), got.out.size()), -1)
          << where;
    }
  }
}

TEST(AdamIdentityTest, OddLengthsAllFormatsAllOffsets) {
  for (size_t n : {0, 1, 15, 17, 1023}) {
    for (size_t offset = 0; offset < 16; offset += (n > 17 ? 5 : 1)) {
      for (FloatFormat g : {FloatFormat::kFp32, FloatFormat::kBf16, FloatFormat::kFp16}) {
        for (ParamOut o : {ParamOut::kNone, ParamOut::kBf16, ParamOut::kFp16}) {
          for (AdamMode mode : {AdamMode::kAdamW, AdamMode::kAdam}) {
            ExpectIdentical({n, offset, g, o, mode});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(AdamIdentityTest, OneMebiPlusSeven) {
  const size_t n = (size_t{1} << 20) + 7;
  ExpectIdentical({n, 0, FloatFormat::kFp32, ParamOut::kNone, AdamMode::kAdamW});
  ExpectIdentical({n, 5, FloatFormat::kBf16, ParamOut::kBf16, AdamMode::kAdamW});
  ExpectIdentical({n, 9, FloatFormat::kFp16, ParamOut::kFp16, AdamMode::kAdam});
}

TEST(AdamIdentityTest, TorchRoundingOddLengthsAndOffsets) {
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{1023}, (size_t{1} << 20) + 7}) {
    for (size_t offset = 0; offset < 16; offset += (n > 17 ? 5 : 1)) {
      ExpectIdentical({n, offset, FloatFormat::kFp32, ParamOut::kNone, AdamMode::kAdamWTorch});
      if (HasFatalFailure()) return;
    }
  }
}

// ---------------------------------------------------------------------------------------
// kAdamWTorch: torch.optim.AdamW's rounding (torch 1.13, single-tensor CPU path), one float
// operation at a time as optim.h lists them; this file is compiled with -ffp-contract=off,
// so only the std::fma calls fuse. kAdamWTorchLerp: torch >= 2.0's, whose first moment is
// exp_avg.lerp_(grad, 1 - beta1) (ATen's vectorised lerp: fma(w, end - self, self) for
// w < 0.5). Every ISA must give these bits.
// ---------------------------------------------------------------------------------------

void ExpectTorchsOperationSequence(AdamMode mode) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = 4099;
  AdamHyperParams h;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.05;
  h.mode = mode;
  const float scale = 0.37f;
  std::vector<float> p0(n);
  for (float& x : p0) x = normal(rng);
  std::vector<std::vector<float>> grads(10, std::vector<float>(n));
  for (auto& g : grads) {
    for (float& x : g) x = normal(rng) * 3.0f;
  }
  // The reference: float arithmetic, scalars rounded from double as torch passes them.
  std::vector<float> rp = p0, rm(n, 0.0f), rv(n, 0.0f);
  for (int64_t t = 1; t <= 10; ++t) {
    const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
    const float b1 = static_cast<float>(h.beta1), c1 = static_cast<float>(1.0 - h.beta1);
    const float b2 = static_cast<float>(h.beta2), c2 = static_cast<float>(1.0 - h.beta2);
    const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
    const float bc2_sqrt =
        static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(t))));
    const float neg_step = static_cast<float>(-h.lr / bc1);
    const float eps = static_cast<float>(h.eps);
    for (size_t i = 0; i < n; ++i) {
      const float g = grads[t - 1][i] * scale;
      rp[i] = rp[i] * decay;
      rm[i] = mode == AdamMode::kAdamWTorchLerp ? std::fma(c1, g - rm[i], rm[i])
                                                : std::fma(g, c1, rm[i] * b1);
      rv[i] = std::fma(g * c2, g, rv[i] * b2);
      const float denom = std::sqrt(rv[i]) / bc2_sqrt + eps;
      rp[i] = rp[i] + (neg_step * rm[i]) / denom;
    }
  }
  for (CpuIsa isa : test::SupportedIsas()) {
    std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
    CpuKernelOptions opt;
    opt.isa = isa;
    opt.threads = 2;
    for (int64_t t = 1; t <= 10; ++t) {
      h.step = t;
      AdamSlice s;
      s.master = p.data();
      s.exp_avg = m.data();
      s.exp_avg_sq = v.data();
      s.grad = grads[t - 1].data();
      s.n = n;
      Status st = AdamStep(s, h, scale, opt);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    ASSERT_EQ(test::FirstBitDifference(p.data(), rp.data(), n), -1) << CpuIsaName(isa);
    ASSERT_EQ(test::FirstBitDifference(m.data(), rm.data(), n), -1) << CpuIsaName(isa);
    ASSERT_EQ(test::FirstBitDifference(v.data(), rv.data(), n), -1) << CpuIsaName(isa);
  }
}

TEST(AdamTorchRoundingTest, EqualsTorch1OperationSequenceBitForBit) {
  ExpectTorchsOperationSequence(AdamMode::kAdamWTorch);
}

TEST(AdamTorchRoundingTest, EqualsTorch2LerpOperationSequenceBitForBit) {
  ExpectTorchsOperationSequence(AdamMode::kAdamWTorchLerp);
}

TEST(AdamTorchRoundingTest, TakesFp32OnlyAndDiffersFromTheFusedForm) {
  const size_t n = 257;
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n), p2(n), m2(n, 0.0f), v2(n, 0.0f);
  std::vector<uint16_t> g16(n, 0), out(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    p[i] = p2[i] = normal(rng);
    g[i] = normal(rng);
  }
  AdamHyperParams h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  h.mode = AdamMode::kAdamWTorch;
  AdamSlice s;
  s.master = p.data();
  s.exp_avg = m.data();
  s.exp_avg_sq = v.data();
  s.grad = g16.data();
  s.grad_format = FloatFormat::kBf16;
  s.n = n;
  EXPECT_EQ(AdamStep(s, h, 1.0f).code(), StatusCode::kNotSupported);
  s.grad = g.data();
  s.grad_format = FloatFormat::kFp32;
  s.param_out = out.data();
  s.param_out_format = ParamOut::kBf16;
  EXPECT_EQ(AdamStep(s, h, 1.0f).code(), StatusCode::kNotSupported);
  s.param_out = nullptr;
  s.param_out_format = ParamOut::kNone;
  // Several steps: the two roundings must give different bits somewhere (else the mode
  // would not be selected), but agree to float precision.
  AdamSlice f = s;
  f.master = p2.data();
  f.exp_avg = m2.data();
  f.exp_avg_sq = v2.data();
  AdamHyperParams hf = h;
  hf.mode = AdamMode::kAdamW;
  for (int64_t t = 1; t <= 5; ++t) {
    h.step = hf.step = t;
    ASSERT_TRUE(AdamStep(s, h, 1.0f).ok());
    ASSERT_TRUE(AdamStep(f, hf, 1.0f).ok());
  }
  EXPECT_NE(test::FirstBitDifference(p.data(), p2.data(), n), -1);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(p[i], p2[i], 1e-6f * 4) << i;
}

// Random lengths and offsets; the seed is printed on failure.
TEST(AdamIdentityTest, RandomSizesAndOffsets) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int k = 0; k < 6; ++k) {
    const size_t n = rng() % 70000;
    const size_t offset = rng() % 16;
    const auto g = static_cast<FloatFormat>(rng() % 3);
    const auto o = static_cast<ParamOut>(rng() % 3);
    SCOPED_TRACE("seed " + std::to_string(seed) + " n " + std::to_string(n));
    ExpectIdentical({n, offset, g, o, rng() % 2 ? AdamMode::kAdam : AdamMode::kAdamW});
    if (HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------------------------------
// Arguments and ISA selection.
// ---------------------------------------------------------------------------------------

TEST(AdamArgsTest, RejectsNullsOverlapAndBadHyperParams) {
  std::vector<float> a(64), b(64), c(64), g(64);
  std::vector<uint16_t> out(64);
  AdamSlice s{a.data(),           b.data(), c.data(),        g.data(),
              FloatFormat::kFp32, nullptr,  ParamOut::kNone, 64};
  AdamHyperParams h;
  EXPECT_TRUE(AdamStep(s, h, 1.0f).ok());

  AdamSlice null_grad = s;
  null_grad.grad = nullptr;
  EXPECT_EQ(AdamStep(null_grad, h, 1.0f).code(), StatusCode::kInvalidArgument);
  null_grad.n = 0;  // nothing to do: nulls are fine
  EXPECT_TRUE(AdamStep(null_grad, h, 1.0f).ok());

  AdamSlice missing_out = s;
  missing_out.param_out_format = ParamOut::kBf16;
  EXPECT_EQ(AdamStep(missing_out, h, 1.0f).code(), StatusCode::kInvalidArgument);
  AdamSlice stray_out = s;
  stray_out.param_out = out.data();
  EXPECT_EQ(AdamStep(stray_out, h, 1.0f).code(), StatusCode::kInvalidArgument);

  AdamSlice overlap = s;
  overlap.exp_avg = a.data() + 10;
  overlap.n = 20;
  Status st = AdamStep(overlap, h, 1.0f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.ToString();

  AdamHyperParams bad = h;
  bad.step = 0;
  EXPECT_EQ(AdamStep(s, bad, 1.0f).code(), StatusCode::kInvalidArgument);
  bad = h;
  bad.beta2 = 1.0;
  EXPECT_EQ(AdamStep(s, bad, 1.0f).code(), StatusCode::kInvalidArgument);
  bad = h;
  bad.lr = -1;
  EXPECT_EQ(AdamStep(s, bad, 1.0f).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamStep(s, h, std::nanf("")).code(), StatusCode::kInvalidArgument);
  CpuKernelOptions neg;
  neg.threads = -1;
  EXPECT_EQ(AdamStep(s, h, 1.0f, neg).code(), StatusCode::kInvalidArgument);
}

TEST(AdamArgsTest, IsaSelection) {
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    Result<CpuIsa> r = ResolveCpuIsa(isa);
    if (CpuSupports(isa)) {
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(*r, isa);
    } else {
      ASSERT_EQ(r.status().code(), StatusCode::kNotSupported);
      EXPECT_NE(r.status().message().find(CpuIsaName(isa)), std::string::npos);
    }
  }
  EXPECT_EQ(ParseCpuIsa("avx9").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseCpuIsa("avx2"), CpuIsa::kAvx2);

  ASSERT_EQ(setenv("STRATA_CPU_ISA", "scalar", 1), 0);
  EXPECT_EQ(*ResolveCpuIsa(CpuIsa::kAuto), CpuIsa::kScalar);
  ASSERT_EQ(setenv("STRATA_CPU_ISA", "sse9", 1), 0);
  Result<CpuIsa> bad = ResolveCpuIsa(CpuIsa::kAuto);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("sse9"), std::string::npos);
  float x[4] = {};
  AdamSlice s{x, x + 1, x + 2, x + 3, FloatFormat::kFp32, nullptr, ParamOut::kNone, 0};
  EXPECT_EQ(AdamStep(s, AdamHyperParams{}, 1.0f).code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(unsetenv("STRATA_CPU_ISA"), 0);
  Result<CpuIsa> best = ResolveCpuIsa(CpuIsa::kAuto);
  ASSERT_TRUE(best.ok());
  EXPECT_TRUE(CpuSupports(*best));
  if (CpuSupports(CpuIsa::kAvx512)) {
    EXPECT_EQ(*best, CpuIsa::kAvx512);
  }
}

}  // namespace
}  // namespace strata
