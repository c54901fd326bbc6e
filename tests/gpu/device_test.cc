// Device conformance suite: one TEST_P suite run against every Device implementation
// (HostDevice always; CudaDevice where a CUDA GPU is present, skipped otherwise).
//
// No test asserts on speed. The overlap test checks an ordering property (a copy ran while a
// busy operation was in progress) from the observer's timestamps, and retries with longer
// busy periods before failing so a loaded machine cannot make it flaky.
#include "strata/device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace strata {
namespace {

using namespace std::chrono_literals;

constexpr size_t kMiB = 1 << 20;

// Page-aligned, page-rounded host memory: two buffers never share a page, which
// cudaHostRegister requires (it refuses to register a page twice).
template <typename T>
struct PageAllocator {
  using value_type = T;
  PageAllocator() = default;
  template <typename U>
  PageAllocator(const PageAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    constexpr size_t kPage = 4096;
    void* p = std::aligned_alloc(kPage, (n * sizeof(T) + kPage - 1) / kPage * kPage + kPage);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const PageAllocator<U>&) const {
    return true;
  }
};
using HostVec = std::vector<uint8_t, PageAllocator<uint8_t>>;

uint64_t NewSeed() { return std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32); }

HostVec RandomBytes(size_t n, std::mt19937_64& rng) {
  HostVec v(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
  }
  return v;
}

std::string KindName(const testing::TestParamInfo<DeviceKind>& info) {
  return info.param == DeviceKind::kHost ? "Host" : "Cuda";
}

// Collects the observer's records, thread-safely.
class RecordLog {
 public:
  std::function<void(const DeviceOpRecord&)> Observer() {
    return [this](const DeviceOpRecord& r) {
      std::lock_guard<std::mutex> lock(mu_);
      records_.push_back(Entry{r.lane, std::string(r.label), r.start, r.end, r.bytes, r.ok});
    };
  }
  struct Entry {
    Lane lane;
    std::string label;
    std::chrono::steady_clock::time_point start, end;
    uint64_t bytes;
    bool ok;
  };
  std::vector<Entry> Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return records_;
  }

 private:
  std::mutex mu_;
  std::vector<Entry> records_;
};

class DeviceTest : public testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::kCuda && !CudaAvailable()) {
      GTEST_SKIP() << "no CUDA device in this build/machine";
    }
  }

  std::unique_ptr<Device> Make(uint64_t budget = 0) {
    DeviceOptions options;
    options.memory_budget_bytes = budget;
    auto dev =
        GetParam() == DeviceKind::kHost ? CreateHostDevice(options) : CreateCudaDevice(options);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    return dev.ok() ? std::move(dev).value() : nullptr;
  }

  // Pinned host buffers make CUDA copies truly asynchronous; a no-op on the host device.
  void Register(Device& dev, HostVec& v) {
    if (!v.empty()) {
      ASSERT_TRUE(dev.RegisterHostMemory(v.data(), v.size()).ok());
    }
  }
  void Unregister(Device& dev, HostVec& v) {
    if (!v.empty()) {
      ASSERT_TRUE(dev.UnregisterHostMemory(v.data()).ok());
    }
  }

  void SyncAll(Device& dev) {
    for (int i = 0; i < kNumLanes; ++i) {
      Status s = dev.SynchronizeLane(static_cast<Lane>(i));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
};

TEST_P(DeviceTest, BudgetIsEnforcedWithAnActionableMessage) {
  auto dev = Make(1 * kMiB);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->Kind(), GetParam());
  EXPECT_FALSE(dev->Name().empty());

  auto a = dev->Allocate(600 * 1024);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = dev->Allocate(600 * 1024);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  const std::string& msg = b.status().message();
  EXPECT_NE(msg.find("cannot allocate 600.0 KiB (614400 bytes)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("budget is 1.0 MiB (1048576 bytes)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("600.0 KiB (614400 bytes) are in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find("raise the device memory budget"), std::string::npos) << msg;
  // A refused request changes nothing.
  EXPECT_EQ(dev->MemoryStats().in_use_bytes, 600u * 1024);

  // Exactly what is left still fits; one more byte does not.
  auto c = dev->Allocate(kMiB - 600 * 1024);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto d = dev->Allocate(1);
  EXPECT_EQ(d.status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(dev->Free(*a).ok());
  ASSERT_TRUE(dev->Free(*c).ok());
  // A single request larger than the whole budget.
  auto e = dev->Allocate(kMiB + 1);
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory);
  auto f = dev->Allocate(kMiB);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(dev->Free(*f).ok());
  EXPECT_EQ(dev->MemoryStats().in_use_bytes, 0u);
}

TEST_P(DeviceTest, AccountingIsExactUnderRandomAllocations) {
  const uint64_t seed = NewSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const uint64_t budget = 8 * kMiB;
  auto dev = Make(budget);
  ASSERT_NE(dev, nullptr);

  std::map<void*, size_t> live;
  uint64_t in_use = 0, peak = 0;
  const size_t odd[] = {0, 1, 15, 17, 1023, kMiB + 7};
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(dev->Free(it->first).ok());
      in_use -= it->second;
      live.erase(it);
    } else {
      size_t bytes = (rng() % 4 == 0) ? odd[rng() % 6] : rng() % (512 * 1024);
      auto p = dev->Allocate(bytes);
      if (in_use + bytes > budget) {
        ASSERT_EQ(p.status().code(), StatusCode::kOutOfMemory) << "bytes=" << bytes;
      } else {
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        ASSERT_NE(*p, nullptr);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << "not 256-byte aligned";
        ASSERT_EQ(live.count(*p), 0u) << "pointer handed out twice";
        live[*p] = bytes;
        in_use += bytes;
        peak = std::max(peak, in_use);
      }
    }
    DeviceMemoryStats st = dev->MemoryStats();
    ASSERT_EQ(st.budget_bytes, budget);
    ASSERT_EQ(st.in_use_bytes, in_use);
    ASSERT_EQ(st.peak_bytes, peak);
    ASSERT_LE(st.peak_bytes, budget);
  }
  dev->ResetPeak();
  EXPECT_EQ(dev->MemoryStats().peak_bytes, in_use);
  for (auto& [p, n] : live) ASSERT_TRUE(dev->Free(p).ok());
  EXPECT_EQ(dev->MemoryStats().in_use_bytes, 0u);
  EXPECT_EQ(dev->MemoryStats().peak_bytes, in_use);
}

TEST_P(DeviceTest, FreeRejectsForeignPointers) {
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  EXPECT_TRUE(dev->Free(nullptr).ok());
  int on_stack = 0;
  EXPECT_EQ(dev->Free(&on_stack).code(), StatusCode::kInvalidArgument);
  auto p = dev->Allocate(100);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(dev->Free(*p).ok());
  EXPECT_EQ(dev->Free(*p).code(), StatusCode::kInvalidArgument) << "double free accepted";
}

TEST_P(DeviceTest, CopiesRejectRangesOutsideAllocations) {
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  auto p = dev->Allocate(1000);
  ASSERT_TRUE(p.ok());
  std::vector<uint8_t> host(2000);
  // Host memory passed as the device side.
  EXPECT_EQ(dev->CopyToDevice(host.data(), host.data() + 1000, 10, "bad").code(),
            StatusCode::kInvalidArgument);
  // Overrunning the allocation.
  EXPECT_EQ(dev->CopyToDevice(*p, host.data(), 1001, "overrun").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->CopyToHost(host.data(), static_cast<char*>(*p) + 1, 1000, "overrun").code(),
            StatusCode::kInvalidArgument);
  // In range at an offset is fine.
  EXPECT_TRUE(dev->CopyToDevice(static_cast<char*>(*p) + 999, host.data(), 1, "last").ok());
  SyncAll(*dev);
  ASSERT_TRUE(dev->Free(*p).ok());
}

// AdoptMemory: memory the device did not allocate (a framework's tensors) may be the device
// side of copies until ForgetMemory. On the host device that is any host memory; a GPU takes
// only its own device memory and refuses host memory with a clear error.
TEST_P(DeviceTest, AdoptedMemoryIsADeviceRangeUntilForgotten) {
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  std::vector<uint8_t> foreign(1000), out(1000, 0);
  for (size_t i = 0; i < foreign.size(); ++i) foreign[i] = uint8_t(i * 7 + 3);
  EXPECT_EQ(dev->ForgetMemory(foreign.data()).code(), StatusCode::kInvalidArgument);
  if (GetParam() == DeviceKind::kHost) {
    ASSERT_TRUE(dev->AdoptMemory(foreign.data(), foreign.size()).ok());
    ASSERT_TRUE(dev->AdoptMemory(foreign.data(), 10).ok());  // twice: two forgets
    ASSERT_TRUE(dev->CopyToHost(out.data(), foreign.data() + 1, 999, "adopted").ok());
    EXPECT_EQ(dev->CopyToHost(out.data(), foreign.data() + 1, 1000, "overrun").code(),
              StatusCode::kInvalidArgument);
    SyncAll(*dev);
    EXPECT_EQ(0, std::memcmp(out.data(), foreign.data() + 1, 999));
    ASSERT_TRUE(dev->ForgetMemory(foreign.data()).ok());
    EXPECT_TRUE(dev->CopyToHost(out.data(), foreign.data(), 10, "still adopted once").ok());
    ASSERT_TRUE(dev->ForgetMemory(foreign.data()).ok());
    SyncAll(*dev);
  } else {
    Status s = dev->AdoptMemory(foreign.data(), foreign.size());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("not device memory"), std::string::npos) << s.ToString();
    auto p = dev->Allocate(1000);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(dev->AdoptMemory(static_cast<char*>(*p) + 100, 100).ok());
    ASSERT_TRUE(dev->ForgetMemory(static_cast<char*>(*p) + 100).ok());
    ASSERT_TRUE(dev->Free(*p).ok());
  }
  EXPECT_EQ(dev->CopyToHost(out.data(), foreign.data(), 10, "forgotten").code(),
            StatusCode::kInvalidArgument);
}

TEST_P(DeviceTest, CopiesRoundTripByteExact) {
  const uint64_t seed = NewSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto dev = Make(64 * kMiB);
  ASSERT_NE(dev, nullptr);

  std::vector<size_t> sizes = {0, 1, 15, 17, 1023, kMiB + 7};
  for (int i = 0; i < 10; ++i) sizes.push_back(rng() % (3 * kMiB));
  for (size_t n : sizes) {
    SCOPED_TRACE("bytes=" + std::to_string(n));
    const size_t offset = rng() % 64;  // unaligned device offsets too
    HostVec src = RandomBytes(n, rng);
    HostVec dst(n, 0xAB);
    Register(*dev, src);
    Register(*dev, dst);
    auto buf = dev->Allocate(n + offset);
    ASSERT_TRUE(buf.ok()) << buf.status().ToString();
    void* dptr = static_cast<char*>(*buf) + offset;
    ASSERT_TRUE(dev->CopyToDevice(dptr, src.data(), n, "h2d").ok());
    auto copied = dev->Record(Lane::kH2D);
    ASSERT_TRUE(copied.ok());
    ASSERT_TRUE(dev->WaitEvent(Lane::kD2H, *copied).ok());
    ASSERT_TRUE(dev->CopyToHost(dst.data(), dptr, n, "d2h").ok());
    Status s = dev->SynchronizeLane(Lane::kD2H);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE((*copied)->Query());
    ASSERT_TRUE(src == dst) << "data differs after a round trip";
    Unregister(*dev, src);
    Unregister(*dev, dst);
    ASSERT_TRUE(dev->Free(*buf).ok());
  }
}

TEST_P(DeviceTest, LaneRunsItsWorkInSubmissionOrder) {
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  std::vector<int> order;  // touched only by the compute lane's host functions
  for (int i = 0; i < 200; ++i) {
    if (i % 50 == 0) {
      ASSERT_TRUE(dev->EnqueueBusy(Lane::kCompute, 1ms, "busy").ok());
    }
    ASSERT_TRUE(dev->EnqueueHostFunction(
                       Lane::kCompute,
                       [&order, i] {
                         order.push_back(i);
                         return Status::OK();
                       },
                       "fn")
                    .ok());
  }
  Status s = dev->SynchronizeLane(Lane::kCompute);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(order[i], i);
}

TEST_P(DeviceTest, EventsOrderWorkAcrossLanes) {
  // The compute lane waits for an H2D copy that is held back behind a busy period, then reads
  // the copied data: without the wait it would read the old contents.
  const uint64_t seed = NewSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  const size_t n = 4 * kMiB + 7;
  HostVec src = RandomBytes(n, rng);
  HostVec zeros(n, 0);
  HostVec seen(n, 0xAB);
  Register(*dev, src);
  Register(*dev, zeros);
  Register(*dev, seen);
  auto buf = dev->Allocate(n);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(dev->CopyToDevice(*buf, zeros.data(), n, "zero", Lane::kCompute).ok());
  ASSERT_TRUE(dev->SynchronizeLane(Lane::kCompute).ok());

  ASSERT_TRUE(dev->EnqueueBusy(Lane::kH2D, 100ms, "hold back").ok());
  ASSERT_TRUE(dev->CopyToDevice(*buf, src.data(), n, "payload").ok());
  auto copied = dev->Record(Lane::kH2D);
  ASSERT_TRUE(copied.ok());
  ASSERT_TRUE(dev->WaitEvent(Lane::kCompute, *copied).ok());
  ASSERT_TRUE(dev->CopyToHost(seen.data(), *buf, n, "read back", Lane::kCompute).ok());
  std::atomic<bool> checked{false};
  bool equal = false;
  ASSERT_TRUE(dev->EnqueueHostFunction(
                     Lane::kCompute,
                     [&] {
                       equal = (seen == src);
                       checked = true;
                       return Status::OK();
                     },
                     "check")
                  .ok());
  Status s = dev->SynchronizeLane(Lane::kCompute);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE((*copied)->Query());
  EXPECT_TRUE(checked);
  EXPECT_TRUE(equal) << "compute lane did not see the data of the copy it waited for";
  Unregister(*dev, src);
  Unregister(*dev, zeros);
  Unregister(*dev, seen);
  ASSERT_TRUE(dev->Free(*buf).ok());
}

TEST_P(DeviceTest, CopiesOverlapWithBusyCompute) {
  // The H2D lane starts its copies once the compute lane has begun a busy period (it waits
  // for an event recorded just before it), so the copies can only miss the busy period if
  // the copy lane were serialised behind compute. The busy period grows on each attempt so a
  // machine that delays a worker thread cannot cause a false failure.
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  const size_t n = kMiB;
  HostVec src(n, 7);
  Register(*dev, src);
  auto buf = dev->Allocate(n);
  ASSERT_TRUE(buf.ok());
  bool overlapped = false;
  for (auto busy = 100ms; busy <= 3200ms && !overlapped; busy *= 2) {
    RecordLog log;
    dev->SetObserver(log.Observer());
    auto started = dev->Record(Lane::kCompute);
    ASSERT_TRUE(started.ok());
    ASSERT_TRUE(dev->EnqueueBusy(Lane::kCompute, busy, "busy").ok());
    ASSERT_TRUE(dev->WaitEvent(Lane::kH2D, *started).ok());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(dev->CopyToDevice(*buf, src.data(), n, "copy").ok());
    SyncAll(*dev);
    dev->SetObserver(nullptr);
    std::vector<RecordLog::Entry> recs = log.Snapshot();
    auto busy_rec =
        std::find_if(recs.begin(), recs.end(), [](const auto& r) { return r.label == "busy"; });
    ASSERT_NE(busy_rec, recs.end());
    EXPECT_GE(busy_rec->end - busy_rec->start, busy * 9 / 10) << "busy period cut short";
    for (const auto& r : recs) {
      if (r.label == "copy" && r.start < busy_rec->end && r.end > busy_rec->start) {
        overlapped = true;
      }
    }
  }
  EXPECT_TRUE(overlapped) << "no copy ran while the compute lane was busy";
  Unregister(*dev, src);
  ASSERT_TRUE(dev->Free(*buf).ok());
}

TEST_P(DeviceTest, FailedHostFunctionFailsItsLaneAndSkipsLaterWork) {
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  RecordLog log;
  dev->SetObserver(log.Observer());
  EXPECT_TRUE(dev->Error().ok());
  auto before = dev->Record(Lane::kCompute);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(dev->EnqueueHostFunction(
                     Lane::kCompute, [] { return Status::IOError("disk on fire"); }, "failing op")
                  .ok());
  std::atomic<bool> later_ran{false};
  ASSERT_TRUE(dev->EnqueueHostFunction(
                     Lane::kCompute,
                     [&] {
                       later_ran = true;
                       return Status::OK();
                     },
                     "later op")
                  .ok());
  auto after = dev->Record(Lane::kCompute);
  ASSERT_TRUE(after.ok());

  Status s = dev->SynchronizeLane(Lane::kCompute);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("disk on fire"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("failing op"), std::string::npos) << s.ToString();
  EXPECT_TRUE((*before)->Synchronize().ok()) << "an event before the failure reports it";
  EXPECT_EQ((*after)->Synchronize().code(), StatusCode::kIOError);
  EXPECT_TRUE((*after)->Query());
  EXPECT_EQ(dev->Error().code(), StatusCode::kIOError);
  EXPECT_NE(dev->Error().message().find("disk on fire"), std::string::npos);
  EXPECT_FALSE(later_ran) << "work after a failure on the same lane ran";
  // The error is sticky, and other lanes keep working.
  EXPECT_EQ(dev->SynchronizeLane(Lane::kCompute).code(), StatusCode::kIOError);
  std::atomic<bool> other_ran{false};
  ASSERT_TRUE(dev->EnqueueHostFunction(
                     Lane::kD2H,
                     [&] {
                       other_ran = true;
                       return Status::OK();
                     },
                     "other lane")
                  .ok());
  EXPECT_TRUE(dev->SynchronizeLane(Lane::kD2H).ok());
  EXPECT_TRUE(other_ran);
  // The failing op was reported (marked failed); the skipped one was not.
  bool saw_failed = false;
  for (const auto& r : log.Snapshot()) {
    if (r.label == "failing op") saw_failed = !r.ok;
    EXPECT_NE(r.label, "later op");
  }
  EXPECT_TRUE(saw_failed);
  dev->SetObserver(nullptr);
}

TEST_P(DeviceTest, ThrowingHostFunctionBecomesAnError) {
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(
      dev->EnqueueHostFunction(
             Lane::kComm, []() -> Status { throw std::runtime_error("bad things"); }, "thrower")
          .ok());
  Status s = dev->SynchronizeLane(Lane::kComm);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("bad things"), std::string::npos) << s.ToString();
}

TEST_P(DeviceTest, ObserverReceivesEveryOperation) {
  const uint64_t seed = NewSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto dev = Make();
  ASSERT_NE(dev, nullptr);
  RecordLog log;
  dev->SetObserver(log.Observer());
  const size_t n = 64 * 1024;
  // Separate buffers per direction: the lanes run concurrently.
  HostVec host(n, 1), host_dst(n, 0);
  Register(*dev, host);
  Register(*dev, host_dst);
  auto buf = dev->Allocate(n);
  auto buf_src = dev->Allocate(n);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(buf_src.ok());

  struct Expect {
    Lane lane;
    uint64_t bytes;
  };
  std::map<std::string, Expect> expected;
  for (int i = 0; i < 60; ++i) {
    std::string label = "op " + std::to_string(i);
    const size_t bytes = rng() % (n + 1);
    switch (rng() % 4) {
      case 0:
        ASSERT_TRUE(dev->CopyToDevice(*buf, host.data(), bytes, label).ok());
        expected[label] = {Lane::kH2D, bytes};
        break;
      case 1:
        ASSERT_TRUE(dev->CopyToHost(host_dst.data(), *buf_src, bytes, label).ok());
        expected[label] = {Lane::kD2H, bytes};
        break;
      case 2:
        ASSERT_TRUE(dev->EnqueueBusy(Lane::kCompute, 100us, label).ok());
        expected[label] = {Lane::kCompute, 0};
        break;
      default:
        ASSERT_TRUE(dev->EnqueueHostFunction(
                           Lane::kComm, [] { return Status::OK(); }, label)
                        .ok());
        expected[label] = {Lane::kComm, 0};
        break;
    }
  }
  SyncAll(*dev);  // every record of a lane is delivered when its SynchronizeLane returns
  std::vector<RecordLog::Entry> recs = log.Snapshot();
  ASSERT_EQ(recs.size(), expected.size());
  std::map<std::string, int> seen;
  for (const auto& r : recs) {
    SCOPED_TRACE(r.label);
    auto it = expected.find(r.label);
    ASSERT_NE(it, expected.end()) << "unexpected record";
    EXPECT_EQ(++seen[r.label], 1) << "reported twice";
    EXPECT_EQ(r.lane, it->second.lane);
    EXPECT_EQ(r.bytes, it->second.bytes);
    EXPECT_LE(r.start, r.end);
    EXPECT_TRUE(r.ok);
  }
  dev->SetObserver(nullptr);
  Unregister(*dev, host);
  Unregister(*dev, host_dst);
  ASSERT_TRUE(dev->Free(*buf).ok());
  ASSERT_TRUE(dev->Free(*buf_src).ok());
}

TEST_P(DeviceTest, ConcurrentCallersKeepAccountingAndDataIntact) {
  const uint64_t seed = NewSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  auto dev = Make(32 * kMiB);
  ASSERT_NE(dev, nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      for (int i = 0; i < 20; ++i) {
        const size_t n = rng() % (256 * 1024) + 1;
        HostVec src = RandomBytes(n, rng), dst(n, 0);
        auto buf = dev->Allocate(n);
        if (!buf.ok()) {
          ++failures;
          continue;
        }
        // Each thread uses its own lane pair so that its waits are its own.
        Lane up = t % 2 ? Lane::kH2D : Lane::kComm;
        Lane down = t % 2 ? Lane::kD2H : Lane::kCompute;
        bool ok = dev->CopyToDevice(*buf, src.data(), n, "up", up).ok();
        auto e = dev->Record(up);
        ok = ok && e.ok() && dev->WaitEvent(down, *e).ok();
        ok = ok && dev->CopyToHost(dst.data(), *buf, n, "down", down).ok();
        auto done = dev->Record(down);
        ok = ok && done.ok() && (*done)->Synchronize().ok();
        if (!ok || src != dst) ++failures;
        if (!dev->Free(*buf).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(dev->MemoryStats().in_use_bytes, 0u);
  EXPECT_LE(dev->MemoryStats().peak_bytes, 32 * kMiB);
}

INSTANTIATE_TEST_SUITE_P(AllDevices, DeviceTest,
                         testing::Values(DeviceKind::kHost, DeviceKind::kCuda), KindName);

// ---- HostDevice-specific behaviour ----

TEST(HostDeviceTest, WaitingOnAFailedEventFailsTheWaitingLane) {
  auto dev = CreateHostDevice({});
  ASSERT_TRUE(dev.ok());
  Device& d = **dev;
  ASSERT_TRUE(d.EnqueueHostFunction(
                   Lane::kH2D, [] { return Status::IOError("short read"); }, "load")
                  .ok());
  auto loaded = d.Record(Lane::kH2D);
  ASSERT_TRUE(loaded.ok());
  ASSERT_TRUE(d.WaitEvent(Lane::kCompute, *loaded).ok());
  std::atomic<bool> computed{false};
  ASSERT_TRUE(d.EnqueueHostFunction(
                   Lane::kCompute,
                   [&] {
                     computed = true;
                     return Status::OK();
                   },
                   "compute on bad data")
                  .ok());
  Status s = d.SynchronizeLane(Lane::kCompute);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("short read"), std::string::npos) << s.ToString();
  EXPECT_FALSE(computed) << "compute ran on data whose load failed";
}

// The layer records on the compute lane at every Acquire, Release and SubmitGrads, and its
// CPU compute leaves that lane idle: such an event needs no hand-off to the lane's worker.
TEST(HostDeviceTest, EventOnAnIdleLaneCompletesAtOnceWithTheLanesError) {
  auto dev = CreateHostDevice({});
  ASSERT_TRUE(dev.ok());
  Device& d = **dev;
  auto idle = d.Record(Lane::kCompute);
  ASSERT_TRUE(idle.ok());
  EXPECT_TRUE((*idle)->Query()) << "an event on an idle lane waited for its worker";
  EXPECT_TRUE(d.WaitEvent(Lane::kCompute, *idle).ok());
  // A busy lane still orders the event after its work.
  ASSERT_TRUE(d.EnqueueBusy(Lane::kCompute, std::chrono::milliseconds(200), "kernel").ok());
  auto busy = d.Record(Lane::kCompute);
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE((*busy)->Query()) << "an event completed before the work enqueued ahead of it";
  EXPECT_TRUE((*busy)->Synchronize().ok());
  // A failed lane's idle events complete with its error.
  ASSERT_TRUE(d.EnqueueHostFunction(
                   Lane::kCompute, [] { return Status::IOError("bad sector"); }, "load")
                  .ok());
  EXPECT_EQ(d.SynchronizeLane(Lane::kCompute).code(), StatusCode::kIOError);
  auto failed = d.Record(Lane::kCompute);
  ASSERT_TRUE(failed.ok());
  EXPECT_TRUE((*failed)->Query());
  EXPECT_EQ((*failed)->Synchronize().code(), StatusCode::kIOError);
  // Waiting on it still fails the waiting lane (the wait is queued, not skipped).
  ASSERT_TRUE(d.WaitEvent(Lane::kH2D, *failed).ok());
  EXPECT_EQ(d.SynchronizeLane(Lane::kH2D).code(), StatusCode::kIOError);
}

TEST(HostDeviceTest, ComputeReadsDeviceMemoryDirectlyAndNativeStreamIsNull) {
  auto dev = CreateHostDevice({});
  ASSERT_TRUE(dev.ok());
  Device& d = **dev;
  EXPECT_EQ(d.NativeStream(Lane::kCompute), nullptr);
  auto buf = d.Allocate(sizeof(int) * 4);
  ASSERT_TRUE(buf.ok());
  const int values[4] = {1, 2, 3, 4};
  ASSERT_TRUE(d.CopyToDevice(*buf, values, sizeof(values), "h2d").ok());
  auto e = d.Record(Lane::kH2D);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(d.WaitEvent(Lane::kCompute, *e).ok());
  int sum = 0;
  ASSERT_TRUE(d.EnqueueHostFunction(
                   Lane::kCompute,
                   [&] {
                     const int* p = static_cast<const int*>(*buf);
                     sum = p[0] + p[1] + p[2] + p[3];
                     return Status::OK();
                   },
                   "sum")
                  .ok());
  ASSERT_TRUE(d.SynchronizeLane(Lane::kCompute).ok());
  EXPECT_EQ(sum, 10);
  ASSERT_TRUE(d.Free(*buf).ok());
}

// Free keeps a block for the next Allocate of its rounded size (as the CUDA device's pool
// does): the engine allocates its buffers per access, and fresh pages fault on first write.
TEST(HostDeviceTest, FreedBlocksAreReusedOutsideTheBudgetAndTheirRangeIsDead) {
  DeviceOptions o;
  o.memory_budget_bytes = 3 * kMiB;
  auto dev = CreateHostDevice(o);
  ASSERT_TRUE(dev.ok());
  Device& d = **dev;
  const size_t big = 2 * kMiB + 7;
  auto a = d.Allocate(big);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(d.Free(*a).ok());
  EXPECT_EQ(d.MemoryStats().in_use_bytes, 0u);
  // A freed block is no longer device memory: copies into it are refused, a second Free too.
  std::vector<uint8_t> host(64, 1);
  EXPECT_EQ(d.CopyToDevice(*a, host.data(), host.size(), "into freed").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Free(*a).code(), StatusCode::kInvalidArgument);
  // The same rounded size gets the kept block back.
  auto b = d.Allocate(big + 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(d.MemoryStats().in_use_bytes, big + 1);
  ASSERT_TRUE(d.Free(*b).ok());
  // Kept blocks do not count against the budget: 3 MiB of other sizes still fit, and their
  // bytes round-trip.
  auto c = d.Allocate(kMiB);
  auto e = d.Allocate(2 * kMiB);
  ASSERT_TRUE(c.ok() && e.ok());
  EXPECT_EQ(d.MemoryStats().in_use_bytes, 3 * kMiB);
  std::vector<uint8_t> in(2 * kMiB), out(2 * kMiB);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(d.CopyToDevice(*e, in.data(), in.size(), "h2d").ok());
  ASSERT_TRUE(d.SynchronizeLane(Lane::kH2D).ok());
  ASSERT_TRUE(d.CopyToHost(out.data(), *e, out.size(), "d2h").ok());
  ASSERT_TRUE(d.SynchronizeLane(Lane::kD2H).ok());
  EXPECT_EQ(in, out);
  EXPECT_FALSE(d.Allocate(1).ok());  // the budget itself is unchanged
  ASSERT_TRUE(d.Free(*c).ok());
  ASSERT_TRUE(d.Free(*e).ok());
}

TEST(HostDeviceTest, DestructorFinishesEnqueuedWork) {
  std::atomic<int> ran{0};
  {
    auto dev = CreateHostDevice({});
    ASSERT_TRUE(dev.ok());
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE((*dev)->EnqueueBusy(Lane::kCompute, 1ms, "busy").ok());
      ASSERT_TRUE((*dev)
                      ->EnqueueHostFunction(
                          Lane::kCompute,
                          [&] {
                            ++ran;
                            return Status::OK();
                          },
                          "fn")
                      .ok());
    }
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(CudaDeviceTest, CreateWithoutAGpuIsNotSupportedWithAHelpfulMessage) {
  auto dev = CreateCudaDevice({});
  if (CudaAvailable()) {
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    EXPECT_EQ((*dev)->Kind(), DeviceKind::kCuda);
    return;
  }
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kNotSupported);
  const std::string& msg = dev.status().message();
  // Either the build lacks CUDA (say how to rebuild) or the machine lacks a GPU (say so).
  const bool no_build = msg.find("no CUDA support") != std::string::npos &&
                        msg.find("STRATA_WITH_CUDA=ON") != std::string::npos;
  const bool no_gpu = msg.find("no CUDA device") != std::string::npos;
  EXPECT_TRUE(no_build || no_gpu) << msg;
  EXPECT_NE(msg.find("host device"), std::string::npos) << "should point at the alternative";
}

}  // namespace
}  // namespace strata
