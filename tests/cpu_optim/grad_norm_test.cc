// GradNormSquared: the documented fixed summation order (checked against a reference
// written here), identical bits for every ISA / thread count / alignment, accuracy
// against a long double sum, and non-finite gradients reported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "strata/optim.h"
#include "tests/cpu_optim/test_util.h"

namespace strata {
namespace {

using test::OffsetBuffer;

// The order optim.h promises: per 4096-element block, element i into lane i % 16 (in
// double), lanes combined l[i]+l[i+8], then +4, +2, +1; block sums added in block order.
double ReferenceNorm(const std::vector<float>& x) {
  double total = 0;
  for (size_t block = 0; block < x.size(); block += kGradNormBlock) {
    double lane[16] = {};
    for (size_t i = block; i < x.size() && i < block + kGradNormBlock; ++i) {
      lane[i % 16] += static_cast<double>(x[i]) * x[i];
    }
    for (int w = 8; w >= 1; w /= 2) {
      for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
    }
    total += lane[0];
  }
  return total;
}

// Fills a buffer of `format` with n values; returns the values as floats (exact widening).
std::vector<float> Fill(FloatFormat format, OffsetBuffer<float>* f32, OffsetBuffer<uint16_t>* f16,
                        size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
    if (format == FloatFormat::kFp32) {
      (*f32)[i] = x;
      values[i] = x;
    } else if (format == FloatFormat::kBf16) {
      (*f16)[i] = FloatToBf16(x);
      values[i] = Bf16ToFloat((*f16)[i]);
    } else {
      (*f16)[i] = FloatToFp16(x);
      values[i] = Fp16ToFloat((*f16)[i]);
    }
  }
  return values;
}

TEST(GradNormTest, FixedOrderIdenticalForEveryIsaThreadCountAndOffset) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{1023}, size_t{4095},
                   size_t{4096}, size_t{4097}, (size_t{1} << 20) + 7}) {
    for (FloatFormat format : {FloatFormat::kFp32, FloatFormat::kBf16, FloatFormat::kFp16}) {
      for (size_t offset : {0, 1, 7, 15}) {
        OffsetBuffer<float> f32(n, offset);
        OffsetBuffer<uint16_t> f16(n, offset);
        const std::vector<float> values = Fill(format, &f32, &f16, n, static_cast<uint32_t>(n));
        const void* grad =
            format == FloatFormat::kFp32 ? static_cast<const void*>(f32.data()) : f16.data();
        const double want = ReferenceNorm(values);
        long double exact = 0;
        for (float v : values) exact += static_cast<long double>(v) * v;
        EXPECT_NEAR(want, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
        for (CpuIsa isa : test::SupportedIsas()) {
          for (int threads : {1, 2, 3, 7}) {
            CpuKernelOptions opt;
            opt.isa = isa;
            opt.threads = threads;
            Result<GradNormResult> r = GradNormSquared(grad, format, n, opt);
            ASSERT_TRUE(r.ok()) << r.status().ToString();
            ASSERT_EQ(r->non_finite, 0u);
            ASSERT_EQ(test::FirstBitDifference(&r->sum_squares, &want, 1), -1)
                << "n " << n << " " << FloatFormatName(format) << " offset " << offset << " "
                << CpuIsaName(isa) << " threads " << threads << ": " << r->sum_squares << " vs "
                << want;
          }
        }
        if (n > 100000 && offset > 0) break;  // the large case: two offsets are enough
      }
    }
  }
}

TEST(GradNormTest, ReportsNanAndInf) {
  const size_t n = 50000;
  for (FloatFormat format : {FloatFormat::kFp32, FloatFormat::kBf16, FloatFormat::kFp16}) {
    OffsetBuffer<float> f32(n, 3);
    OffsetBuffer<uint16_t> f16(n, 3);
    Fill(format, &f32, &f16, n, 7);
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // One NaN in the middle of a block, one -Inf in the last partial vector.
    const size_t nan_at = 20000, inf_at = n - 2;
    if (format == FloatFormat::kFp32) {
      f32[nan_at] = nan;
      f32[inf_at] = -inf;
    } else if (format == FloatFormat::kBf16) {
      f16[nan_at] = FloatToBf16(nan);
      f16[inf_at] = FloatToBf16(-inf);
    } else {
      f16[nan_at] = FloatToFp16(nan);
      f16[inf_at] = FloatToFp16(-inf);
    }
    const void* grad =
        format == FloatFormat::kFp32 ? static_cast<const void*>(f32.data()) : f16.data();
    for (CpuIsa isa : test::SupportedIsas()) {
      for (int threads : {1, 3}) {
        CpuKernelOptions opt;
        opt.isa = isa;
        opt.threads = threads;
        Result<GradNormResult> r = GradNormSquared(grad, format, n, opt);
        ASSERT_TRUE(r.ok());
        EXPECT_EQ(r->non_finite, 2u) << CpuIsaName(isa) << " " << FloatFormatName(format);
        EXPECT_TRUE(std::isnan(r->sum_squares));
        // Only the Inf: the sum is +Inf and one element is reported.
        Result<GradNormResult> tail = GradNormSquared(
            format == FloatFormat::kFp32 ? static_cast<const void*>(f32.data() + nan_at + 1)
                                         : f16.data() + nan_at + 1,
            format, n - nan_at - 1, opt);
        ASSERT_TRUE(tail.ok());
        EXPECT_EQ(tail->non_finite, 1u);
        EXPECT_TRUE(std::isinf(tail->sum_squares));
      }
    }
  }
}

TEST(GradNormTest, LargestFiniteValuesDoNotOverflow) {
  std::vector<float> x(1000, std::numeric_limits<float>::max());
  for (CpuIsa isa : test::SupportedIsas()) {
    CpuKernelOptions opt;
    opt.isa = isa;
    Result<GradNormResult> r = GradNormSquared(x.data(), FloatFormat::kFp32, x.size(), opt);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->non_finite, 0u);
    EXPECT_TRUE(std::isfinite(r->sum_squares));
  }
}

TEST(GradNormTest, RejectsNull) {
  EXPECT_EQ(GradNormSquared(nullptr, FloatFormat::kFp32, 3).status().code(),
            StatusCode::kInvalidArgument);
  Result<GradNormResult> empty = GradNormSquared(nullptr, FloatFormat::kFp32, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->sum_squares, 0.0);
}

}  // namespace
}  // namespace strata
