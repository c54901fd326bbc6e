// strata/state_layout.h: the int8 quantization runs of every rank's shard cover each tensor
// exactly once, start on the tensor's block edges except where a shard boundary cuts a block,
// and number their scales one after another; the extents' sizes follow; moments encoded and
// decoded through the layout come back within a code step, and a decoded value encodes to the
// same bytes again.
#include "strata/state_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/plan.h"

namespace strata {
namespace {

std::vector<BlockSpec> RandomBlock(std::mt19937_64& rng) {
  BlockSpec b{"b", {}};
  const int tensors = 1 + int(rng() % 4);
  for (int t = 0; t < tensors; ++t) {
    const int64_t n = std::vector<int64_t>{1, 17, 2047, 2048, 2049, 4096 + 7, 9000}[rng() % 7];
    b.tensors.push_back(TensorSpec{std::string("t").append(std::to_string(t)), {n}, true});
  }
  return {b};
}

TEST(StateLayoutTest, Int8RunsCoverEachTensorOnceOnItsBlockEdges) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + int(rng() % 4);
    auto layout = engine_internal::ComputeLayout(RandomBlock(rng), 64, world);
    ASSERT_TRUE(layout.ok());
    const BlockLayout& bl = (*layout)[0];
    std::vector<int> covered(bl.padded_numel, 0);
    for (int r = 0; r < world; ++r) {
      const BlockStateLayout st = DescribeBlockState(bl, r, world, {StateFormat::kInt8});
      uint64_t scales = 0;
      for (const Int8Run& run : st.runs) {
        ASSERT_LT(run.lo, run.hi);
        EXPECT_EQ(run.scale, scales);
        scales += Int8StateBlocks(run.hi - run.lo);
        const uint64_t g = uint64_t(r) * bl.shard_numel + run.lo;
        const TensorLayout* t = nullptr;
        for (const TensorLayout& x : bl.tensors) {
          if (g >= x.offset && g < x.offset + x.numel) t = &x;
        }
        ASSERT_NE(t, nullptr) << "run at " << g << " lies in padding";
        ASSERT_LE(g + (run.hi - run.lo), t->offset + t->numel) << "run crosses a tensor";
        const uint64_t into = (g - t->offset) % kInt8StateBlock;
        if (into != 0) {  // a block cut by this shard's start: up to the block's edge at most
          EXPECT_EQ(run.lo, 0u);
          EXPECT_LE(into + (run.hi - run.lo), kInt8StateBlock);
        }
        for (uint64_t i = g; i < g + (run.hi - run.lo); ++i) ++covered[i];
      }
      EXPECT_EQ(st.exp_avg.scales, scales);
      EXPECT_EQ(st.exp_avg.bytes, bl.shard_numel + 4 * scales);
      EXPECT_EQ(st.exp_avg.scale_offset, bl.shard_numel);
      EXPECT_EQ(st.exp_avg_sq.bytes, st.exp_avg.bytes);
      EXPECT_EQ(st.master.bytes, bl.shard_numel * 4);
    }
    for (const TensorLayout& t : bl.tensors) {
      for (uint64_t i = t.offset; i < t.offset + t.numel; ++i) ASSERT_EQ(covered[i], 1) << i;
    }
  }
}

TEST(StateLayoutTest, BytesPerParamHaveOneSource) {
  EXPECT_EQ(StateBytesPerParam({StateFormat::kFp32}), 12.0);
  EXPECT_EQ(StateBytesPerParam({StateFormat::kBf16}), 8.0);
  EXPECT_EQ(StateBytesPerParam({StateFormat::kInt8}), 6.0 + 8.0 / 2048);
  EXPECT_EQ(MomentElemBytes(StateFormat::kInt8), 1u);
  const MasterFormat bf16 = MasterFormat::kBf16Stochastic;
  EXPECT_EQ(StateBytesPerParam({StateFormat::kInt8, bf16}), 4.0 + 8.0 / 2048);
  EXPECT_EQ(StateBytesPerParam({StateFormat::kFp32, bf16}), 10.0);
  EXPECT_EQ(MasterElemBytes(bf16), 2u);
  EXPECT_EQ(MasterElemBytes(MasterFormat::kFp32), 4u);
}

// A bf16 master's extent is 2 bytes per value; it decodes exactly and encodes to nearest; a
// wrong length is refused naming it.
TEST(StateLayoutTest, Bf16MasterEncodesToNearestAndDecodesExactly) {
  auto layout = engine_internal::ComputeLayout(
      {BlockSpec{"b", {TensorSpec{"w", {1023}, true}, TensorSpec{"x", {17}, true}}}}, 64, 2);
  ASSERT_TRUE(layout.ok());
  const BlockStateLayout st =
      DescribeBlockState((*layout)[0], 1, 2, {StateFormat::kInt8, MasterFormat::kBf16Stochastic});
  ASSERT_EQ(st.master.elem_bytes, 2u);
  ASSERT_EQ(st.master.bytes, 2 * st.master.values);
  std::vector<float> x(st.master.values);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 3.0f + 1e-3f * float(i);
  std::vector<uint8_t> e(st.master.bytes);
  ASSERT_TRUE(EncodeMaster(st, x, e).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(DecodeMaster(st, e, y).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], Bf16ToFloat(FloatToBf16(x[i]))) << i;
  std::vector<uint8_t> short_extent(e.size() - 2);
  const Status bad = DecodeMaster(st, short_extent, y);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(std::to_string(st.master.bytes)), std::string::npos);
}

TEST(StateLayoutTest, MomentsEncodeAndDecodeThroughTheLayout) {
  auto layout = engine_internal::ComputeLayout(
      {BlockSpec{"b", {TensorSpec{"w", {5000}, true}, TensorSpec{"x", {17}, true}}}}, 64, 2);
  ASSERT_TRUE(layout.ok());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  for (int r = 0; r < 2; ++r) {
    const BlockStateLayout st = DescribeBlockState((*layout)[0], r, 2, {StateFormat::kInt8});
    const uint64_t n = st.exp_avg.values;
    std::vector<float> m(n, 0.f), v(n, 0.f);
    for (const Int8Run& run : st.runs) {
      for (uint64_t i = run.lo; i < run.hi; ++i) m[i] = normal(rng), v[i] = std::exp(normal(rng));
    }
    std::vector<uint8_t> me(st.exp_avg.bytes), ve(st.exp_avg_sq.bytes);
    ASSERT_TRUE(EncodeMoment(st, Component::kExpAvg, m, me).ok());
    ASSERT_TRUE(EncodeMoment(st, Component::kExpAvgSq, v, ve).ok());
    std::vector<float> m2(n), v2(n);
    ASSERT_TRUE(DecodeMoment(st, Component::kExpAvg, me, m2).ok());
    ASSERT_TRUE(DecodeMoment(st, Component::kExpAvgSq, ve, v2).ok());
    for (uint64_t i = 0; i < n; ++i) {
      // A code step: 1/16 of a binade for exp_avg, 1/32 of sqrt(exp_avg_sq) (so ~1/16 of v),
      // below 2^-14 of the block's absmax anything.
      EXPECT_NEAR(m2[i], m[i], std::abs(m[i]) / 15 + 1e-3) << i;
      EXPECT_NEAR(v2[i], v[i], v[i] / 15 + 1e-3) << i;
    }
    std::vector<uint8_t> me2(me.size()), ve2(ve.size());
    ASSERT_TRUE(EncodeMoment(st, Component::kExpAvg, m2, me2).ok());
    ASSERT_TRUE(EncodeMoment(st, Component::kExpAvgSq, v2, ve2).ok());
    EXPECT_EQ(me2, me);
    EXPECT_EQ(ve2, ve);
    std::vector<uint8_t> short_(me.size() - 1);
    EXPECT_EQ(EncodeMoment(st, Component::kExpAvg, m, short_).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(DecodeMoment(st, Component::kMaster, me, m2).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace strata
