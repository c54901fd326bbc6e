// CudaDevice behaviour beyond the conformance suite (device_test.cc). Needs a CUDA GPU:
// every test skips where CudaAvailable() is false, but the file compiles in every build
// (it uses the public API only).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "strata/device.h"

namespace strata {
namespace {

class CudaDeviceGpuTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaDeviceGpuTest, LanesHaveTheirOwnStreams) {
  auto dev = CreateCudaDevice({});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::set<void*> streams;
  for (int i = 0; i < kNumLanes; ++i) {
    void* s = (*dev)->NativeStream(static_cast<Lane>(i));
    EXPECT_NE(s, nullptr);
    streams.insert(s);
  }
  EXPECT_EQ(streams.size(), static_cast<size_t>(kNumLanes));
  EXPECT_EQ((*dev)->Name().rfind("cuda:0 ", 0), 0u) << (*dev)->Name();
}

TEST_F(CudaDeviceGpuTest, ZeroBudgetMeansTheWholeGpu) {
  auto dev = CreateCudaDevice({});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_GT((*dev)->MemoryStats().budget_bytes, uint64_t{1} << 30);
}

TEST_F(CudaDeviceGpuTest, UnknownOrdinalIsRefusedByNumber) {
  DeviceOptions options;
  options.cuda_device = 4096;
  auto dev = CreateCudaDevice(options);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dev.status().message().find("CUDA device 4096 does not exist"), std::string::npos)
      << dev.status().ToString();
}

TEST_F(CudaDeviceGpuTest, WaitEventRejectsEventsOfAnotherDeviceKind) {
  auto dev = CreateCudaDevice({});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto host = CreateHostDevice({});
  ASSERT_TRUE(host.ok());
  auto e = (*host)->Record(Lane::kCompute);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*dev)->WaitEvent(Lane::kCompute, *e).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceGpuTest, FreedMemoryIsReusedWithoutGrowingAccounting) {
  DeviceOptions options;
  options.memory_budget_bytes = 64 << 20;
  auto dev = CreateCudaDevice(options);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  for (int i = 0; i < 100; ++i) {
    auto p = (*dev)->Allocate(48 << 20);
    ASSERT_TRUE(p.ok()) << "iteration " << i << ": " << p.status().ToString();
    ASSERT_TRUE((*dev)->Free(*p).ok());
  }
  EXPECT_EQ((*dev)->MemoryStats().in_use_bytes, 0u);
  EXPECT_EQ((*dev)->MemoryStats().peak_bytes, uint64_t{48} << 20);
}

}  // namespace
}  // namespace strata
