// The NCCL communicator. Argument checks run everywhere (label unit); the collectives need
// a GPU and skip without one. One GPU runs a one-rank communicator; two or more GPUs also
// run a two-rank one (one thread per rank and GPU; NCCL forbids two ranks on one GPU).
#include "comm/nccl_communicator.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "strata/device.h"

namespace strata {
namespace {

TEST(NcclCommunicatorTest, RefusesBadArguments) {
  NcclCommOptions o;
  o.unique_id = "short";
  auto c = CreateNcclCommunicator(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("5 bytes, not 128"), std::string::npos)
      << c.status().ToString();

  o.unique_id = std::string(kNcclUniqueIdBytes, '\0');
  o.rank = 2;
  o.world_size = 2;
  c = CreateNcclCommunicator(o);
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("rank 2 is not within world size 2"), std::string::npos);
}

TEST(NcclCommunicatorTest, NeedsACudaDevice) {
  auto host = CreateHostDevice({});
  ASSERT_TRUE(host.ok());
  CommOptions options;
  auto c = CreateNcclCommunicator(options, nullptr, **host);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("Gloo"), std::string::npos) << c.status().ToString();
}

class NcclGpuTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

// Copies `v` to a new device buffer (synchronously, for test setup).
void* Upload(Device& dev, const std::vector<float>& v) {
  auto p = dev.Allocate(v.size() * sizeof(float));
  EXPECT_TRUE(p.ok());
  EXPECT_TRUE(dev.RegisterHostMemory(const_cast<float*>(v.data()), v.size() * 4).ok());
  EXPECT_TRUE(dev.CopyToDevice(*p, v.data(), v.size() * 4, "upload", Lane::kComm).ok());
  EXPECT_TRUE(dev.SynchronizeLane(Lane::kComm).ok());
  EXPECT_TRUE(dev.UnregisterHostMemory(const_cast<float*>(v.data())).ok());
  return *p;
}

std::vector<float> Download(Device& dev, const void* p, size_t n) {
  std::vector<float> v(n, -1.0f);
  EXPECT_TRUE(dev.CopyToHost(v.data(), p, n * 4, "download", Lane::kComm).ok());
  EXPECT_TRUE(dev.SynchronizeLane(Lane::kComm).ok());
  return v;
}

TEST_F(NcclGpuTest, OneRankCollectivesOnTheCommLane) {
  auto dev = CreateCudaDevice({});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  Device& d = **dev;
  auto id = NcclNewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  NcclCommOptions o;
  o.unique_id = *id;
  o.stream = d.NativeStream(Lane::kComm);
  auto comm = CreateNcclCommunicator(o);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  Communicator& c = **comm;
  EXPECT_STREQ(c.backend(), "nccl");
  EXPECT_TRUE(c.device_buffers());

  std::mutex mu;
  std::vector<std::string> ops;
  c.SetObserver([&](const CommOpRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    ops.emplace_back(r.op);
  });

  const size_t n = 1000003;
  std::vector<float> in(n);
  std::iota(in.begin(), in.end(), 1.0f);
  void* src = Upload(d, in);
  auto out = d.Allocate(n * 4);
  ASSERT_TRUE(out.ok());

  // The input is written on the H2D lane behind a busy period; the gather must wait for it.
  std::vector<float> twice(n);
  for (size_t i = 0; i < n; ++i) twice[i] = 2 * in[i];
  ASSERT_TRUE(d.RegisterHostMemory(twice.data(), n * 4).ok());
  ASSERT_TRUE(d.EnqueueBusy(Lane::kH2D, std::chrono::milliseconds(50), "hold").ok());
  ASSERT_TRUE(d.CopyToDevice(src, twice.data(), n * 4, "refill").ok());
  auto filled = d.Record(Lane::kH2D);
  ASSERT_TRUE(filled.ok());
  CollectiveOptions after;
  after.after = *filled;
  after.label = "gather";
  Status s = c.AllGather(src, *out, n, CommDataType::kFloat32, after).Wait();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Download(d, *out, n), twice);

  ASSERT_TRUE(c.AllReduce(src, *out, n, CommDataType::kFloat32, ReduceOp::kAverage).Wait().ok());
  EXPECT_EQ(Download(d, *out, n), twice);  // average over one rank
  ASSERT_TRUE(c.ReduceScatter(src, *out, n, CommDataType::kFloat32, ReduceOp::kSum).Wait().ok());
  EXPECT_EQ(Download(d, *out, n), twice);
  ASSERT_TRUE(c.Broadcast(*out, n, CommDataType::kByte, 0).Wait().ok());
  ASSERT_TRUE(c.Barrier().Wait().ok());
  EXPECT_EQ(c.ReduceScatter(src, *out, n, CommDataType::kByte, ReduceOp::kSum).Wait().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(d.SynchronizeLane(Lane::kComm).ok());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(ops, (std::vector<std::string>{"all-gather", "all-reduce", "reduce-scatter",
                                             "broadcast", "barrier"}));
  }
  c.SetObserver(nullptr);
  ASSERT_TRUE(d.UnregisterHostMemory(twice.data()).ok());
  comm->reset();
  ASSERT_TRUE(d.Free(src).ok());
  ASSERT_TRUE(d.Free(*out).ok());
}

TEST_F(NcclGpuTest, TwoRanksOnTwoGpus) {
  DeviceOptions o1;
  o1.cuda_device = 1;
  if (!CreateCudaDevice(o1).ok()) GTEST_SKIP() << "needs two GPUs";
  auto id = NcclNewUniqueId();
  ASSERT_TRUE(id.ok());
  const size_t n = 4099;
  std::vector<std::vector<float>> results(2);
  std::vector<Status> statuses(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      DeviceOptions o;
      o.cuda_device = r;
      auto dev = CreateCudaDevice(o);
      if (!dev.ok()) {
        statuses[r] = dev.status();
        return;
      }
      NcclCommOptions co;
      co.rank = r;
      co.world_size = 2;
      co.unique_id = *id;
      co.cuda_device = r;
      co.stream = (*dev)->NativeStream(Lane::kComm);
      auto comm = CreateNcclCommunicator(co);
      if (!comm.ok()) {
        statuses[r] = comm.status();
        return;
      }
      std::vector<float> in(2 * n, static_cast<float>(r + 1));
      void* src = Upload(**dev, in);
      auto out = (*dev)->Allocate(n * 4);
      statuses[r] =
          (*comm)->ReduceScatter(src, *out, n, CommDataType::kFloat32, ReduceOp::kAverage).Wait();
      results[r] = Download(**dev, *out, n);
      comm->reset();
      (void)(*dev)->Free(src);
      (void)(*dev)->Free(*out);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].ToString();
    EXPECT_EQ(results[r], std::vector<float>(n, 1.5f)) << "rank " << r;
  }
}

}  // namespace
}  // namespace strata
