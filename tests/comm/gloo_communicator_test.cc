// Tests of strata/comm.h and its Gloo backend with real ranks: each test forks N processes
// that meet through a FileStore in a fresh temporary folder and talk over loopback TCP.
// Data are integer-valued floats so that every sum is exact whatever order Gloo reduces in,
// which makes the reference comparison bit-exact. A killed rank must make the others fail
// (naming it), never hang: the parent kills every child still running after a deadline and
// fails the test.
#include "comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm.h"
#include "strata/device.h"
#include "tests/comm/forked_ranks.h"
#include "tests/temp_dir.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

// Integer-valued float for (seed, case, rank, index): sums over <= 64 ranks are exact.
float Value(uint64_t seed, int c, int rank, size_t i) {
  uint64_t h = seed ^ (uint64_t(c) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(rank) << 48) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000);
}

uint8_t ByteValue(uint64_t seed, int c, int rank, size_t i) {
  return static_cast<uint8_t>(static_cast<int64_t>(Value(seed, c, rank, i)) & 0xff);
}

std::vector<size_t> Sizes(uint64_t seed) {
  std::vector<size_t> sizes = {0, 1, 15, 17, 1023, (size_t{1} << 20) + 7};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 3; ++i) sizes.push_back(rng() % 5000);
  return sizes;
}

// Every collective against a reference computed locally, on every size.
int CollectivesBody(Communicator& comm, uint64_t seed) {
  const int n = comm.world_size();
  const int me = comm.rank();
  int c = 0;
  for (size_t count : Sizes(seed)) {
    ++c;
    // all-gather fp32, out of place
    {
      std::vector<float> in(count), out(count * n, -1.0f);
      for (size_t i = 0; i < count; ++i) in[i] = Value(seed, c, me, i);
      CHILD_OK(comm.AllGather(in.data(), out.data(), count, CommDataType::kFloat32).Wait());
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          CHILD_CHECK(out[r * count + i] == Value(seed, c, r, i), "all-gather count %zu r %d i %zu",
                      count, r, i);
    }
    // all-gather bytes, in place
    {
      std::vector<uint8_t> buf(count * n, 0xEE);
      for (size_t i = 0; i < count; ++i) buf[me * count + i] = ByteValue(seed, c, me, i);
      CHILD_OK(
          comm.AllGather(buf.data() + me * count, buf.data(), count, CommDataType::kByte).Wait());
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          CHILD_CHECK(buf[r * count + i] == ByteValue(seed, c, r, i),
                      "in-place byte all-gather count %zu r %d i %zu", count, r, i);
    }
    // reduce-scatter sum and avg
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<float> in(count * n), out(count, -7.0f);
      for (size_t i = 0; i < count * n; ++i) in[i] = Value(seed, c + 100, me, i);
      std::vector<float> in_copy = in;
      CHILD_OK(comm.ReduceScatter(in.data(), out.data(), count, CommDataType::kFloat32, op).Wait());
      CHILD_CHECK(in == in_copy, "reduce-scatter modified its input");
      for (size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += Value(seed, c + 100, r, me * count + i);
        float want = op == ReduceOp::kSum ? sum : sum / static_cast<float>(n);
        CHILD_CHECK(out[i] == want, "reduce-scatter %s count %zu i %zu: %g != %g", ReduceOpName(op),
                    count, i, out[i], want);
      }
    }
    // reduce-scatter in place: the result lands in this rank's slot; the other slots keep
    // their input
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<float> buf(count * n);
      for (size_t i = 0; i < count * n; ++i) buf[i] = Value(seed, c + 150, me, i);
      CHILD_OK(
          comm.ReduceScatter(buf.data(), buf.data() + me * count, count, CommDataType::kFloat32, op)
              .Wait());
      for (size_t i = 0; i < count * n; ++i) {
        float want = Value(seed, c + 150, me, i);
        if (i / count == size_t(me)) {
          float sum = 0;
          for (int r = 0; r < n; ++r) sum += Value(seed, c + 150, r, i);
          want = op == ReduceOp::kSum ? sum : sum / static_cast<float>(n);
        }
        CHILD_CHECK(buf[i] == want, "in-place reduce-scatter %s count %zu i %zu: %g != %g",
                    ReduceOpName(op), count, i, buf[i], want);
      }
    }
    // all-reduce sum / avg / max, alternating in place and out of place
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      bool in_place = op != ReduceOp::kAverage;
      std::vector<float> in(count), out(count, -3.0f);
      for (size_t i = 0; i < count; ++i) in[i] = Value(seed, c + 200 + int(op), me, i);
      float* dst = in_place ? in.data() : out.data();
      CHILD_OK(comm.AllReduce(in.data(), dst, count, CommDataType::kFloat32, op).Wait());
      for (size_t i = 0; i < count; ++i) {
        float acc = op == ReduceOp::kMax ? -1e30f : 0.0f;
        for (int r = 0; r < n; ++r) {
          float v = Value(seed, c + 200 + int(op), r, i);
          acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
        }
        if (op == ReduceOp::kAverage) acc /= static_cast<float>(n);
        CHILD_CHECK(dst[i] == acc, "all-reduce %s count %zu i %zu: %g != %g", ReduceOpName(op),
                    count, i, dst[i], acc);
      }
    }
    // broadcast from each root
    for (int root = 0; root < n; ++root) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = Value(seed, c + 300 + root, me, i);
      CHILD_OK(comm.Broadcast(buf.data(), count, CommDataType::kFloat32, root).Wait());
      for (size_t i = 0; i < count; ++i)
        CHILD_CHECK(buf[i] == Value(seed, c + 300 + root, root, i),
                    "broadcast root %d count %zu i %zu", root, count, i);
    }
    CHILD_OK(comm.Barrier().Wait());
  }
  return 0;
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, MatchReferenceOnRandomAndOddSizes) {
  const int world = GetParam();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto results =
      RunRanks(world, 60s, [&](Communicator& comm) { return CollectivesBody(comm, seed); });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " (seed " << seed << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// Many collectives issued before any is waited on run in issue order; handles may be
// waited out of order and from other threads; the observer sees each one.
TEST(GlooCommunicator, PipelinedHandlesCompleteInOrderAndAreObserved) {
  const uint64_t seed = 1234;
  auto results = RunRanks(3, 60s, [&](Communicator& comm) {
    const int n = comm.world_size(), me = comm.rank();
    std::atomic<int> observed{0};
    std::atomic<uint64_t> observed_bytes{0};
    comm.SetObserver([&](const CommOpRecord& rec) {
      observed++;
      observed_bytes += rec.bytes;
    });
    constexpr int kOps = 12;
    const size_t count = 777;
    std::vector<std::vector<float>> in(kOps), out(kOps);
    std::vector<CommHandle> handles;
    for (int k = 0; k < kOps; ++k) {
      in[k].resize(count);
      out[k].assign(count * n, 0.0f);
      for (size_t i = 0; i < count; ++i) in[k][i] = Value(seed, k, me, i);
      CollectiveOptions opts;
      opts.label = "pipelined";
      handles.push_back(
          comm.AllGather(in[k].data(), out[k].data(), count, CommDataType::kFloat32, opts));
    }
    // Wait from another thread, last first.
    std::vector<Status> statuses(kOps);
    std::thread waiter([&] {
      for (int k = kOps - 1; k >= 0; --k) statuses[k] = handles[k].Wait();
    });
    waiter.join();
    for (int k = 0; k < kOps; ++k) {
      CHILD_OK(statuses[k]);
      CHILD_CHECK(handles[k].Done(), "op %d not done after Wait", k);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          CHILD_CHECK(out[k][r * count + i] == Value(seed, k, r, i), "op %d r %d i %zu", k, r, i);
    }
    CHILD_CHECK(observed == kOps, "observer saw %d ops", observed.load());
    CHILD_CHECK(observed_bytes == uint64_t{kOps} * count * 4 * (n - 1), "observer bytes %llu",
                static_cast<unsigned long long>(observed_bytes.load()));
    return 0;
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
}

// CollectiveOptions::after: the gather starts only once the copy lane has filled its
// input, even when the fill is slow and the collective was issued first.
TEST(GlooCommunicator, CollectiveWaitsForItsAfterEvent) {
  auto results = RunRanks(2, 60s, [&](Communicator& comm) {
    Result<std::unique_ptr<Device>> dev = CreateHostDevice(DeviceOptions{});
    CHILD_CHECK(dev.ok(), "%s", dev.status().ToString().c_str());
    const size_t count = 4096;
    std::vector<float> in(count, -1.0f), out(count * 2, 0.0f);
    const float mine = static_cast<float>(comm.rank() + 10);
    CHILD_OK((*dev)->EnqueueHostFunction(
        Lane::kH2D,
        [&] {
          std::this_thread::sleep_for(200ms);
          std::fill(in.begin(), in.end(), mine);
          return Status::OK();
        },
        "slow fill"));
    Result<EventPtr> filled = (*dev)->Record(Lane::kH2D);
    CHILD_CHECK(filled.ok(), "%s", filled.status().ToString().c_str());
    CollectiveOptions opts;
    opts.after = *filled;
    CHILD_OK(comm.AllGather(in.data(), out.data(), count, CommDataType::kFloat32, opts).Wait());
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < count; ++i)
        CHILD_CHECK(out[r * count + i] == static_cast<float>(r + 10), "r %d i %zu: %g", r, i,
                    out[r * count + i]);
    return 0;
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
}

// Reduce-scatter split into many pieces gives the same results as one piece.
TEST(GlooCommunicator, PiecewiseReduceScatterMatchesReference) {
  gloo_internal::SetReduceScatterPieceForTesting(64);  // inherited by the forked ranks
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto results = RunRanks(3, 60s, [&](Communicator& comm) {
    const int n = comm.world_size(), me = comm.rank();
    for (size_t count : {size_t{1}, size_t{21}, size_t{22}, size_t{1000}, size_t{4099}}) {
      std::vector<float> in(count * n), out(count);
      for (size_t i = 0; i < in.size(); ++i) in[i] = Value(seed, int(count), me, i);
      CHILD_OK(
          comm.ReduceScatter(in.data(), out.data(), count, CommDataType::kFloat32, ReduceOp::kSum)
              .Wait());
      for (size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += Value(seed, int(count), r, me * count + i);
        CHILD_CHECK(out[i] == sum, "count %zu i %zu: %g != %g", count, i, out[i], sum);
      }
      // In place, piece by piece: each piece overwrites only input already read.
      CHILD_OK(comm.ReduceScatter(in.data(), in.data() + me * count, count, CommDataType::kFloat32,
                                  ReduceOp::kSum)
                   .Wait());
      CHILD_CHECK(std::equal(out.begin(), out.end(), in.begin() + me * count),
                  "in-place piecewise reduce-scatter of %zu differs", count);
    }
    return 0;
  });
  gloo_internal::SetReduceScatterPieceForTesting(size_t{1} << 24);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
}

// Every rank gets bit-identical all-reduce results, and two runs agree bit for bit (the
// data here are not integer-valued, so the reduction order matters).
TEST(GlooCommunicator, AllReduceIsBitIdenticalAcrossRanksAndRuns) {
  TempDir out_dir;
  auto run = [&](const std::string& tag) {
    return RunRanks(4, 60s, [&](Communicator& comm) {
      std::mt19937 rng(77 + comm.rank());
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> v(100003);
      for (float& x : v) x = dist(rng);
      CHILD_OK(comm.AllReduce(v.data(), v.data(), v.size(), CommDataType::kFloat32, ReduceOp::kSum)
                   .Wait());
      std::string path = out_dir.path() + "/" + tag + "." + std::to_string(comm.rank());
      FILE* f = std::fopen(path.c_str(), "wb");
      CHILD_CHECK(f != nullptr, "open %s", path.c_str());
      std::fwrite(v.data(), sizeof(float), v.size(), f);
      std::fclose(f);
      return 0;
    });
  };
  for (const std::string tag : {"a", "b"}) {
    auto results = run(tag);
    for (int r = 0; r < 4; ++r)
      ASSERT_EQ(results[r].exit_code, 0) << "run " << tag << " rank " << r;
  }
  auto read = [&](const std::string& name) {
    std::ifstream f(out_dir.path() + "/" + name, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  std::string ref = read("a.0");
  ASSERT_EQ(ref.size(), 100003u * 4);
  for (const std::string tag : {"a", "b"}) {
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(read(tag + "." + std::to_string(r)) == ref) << tag << " rank " << r;
    }
  }
}

// A rank killed with SIGKILL while the others wait for it in a collective: each survivor
// gets a non-OK status naming rank 1 within about the timeout, and later collectives fail
// at once with Aborted.
TEST(GlooCommunicator, KilledRankMakesOthersFailNamingIt) {
  for (int world : {2, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const int victim = 1;
    auto results = RunRanks(
        world, 3s,
        [&](Communicator& comm) {
          ::close(ready[0]);
          CHILD_OK(comm.Barrier().Wait());
          if (comm.rank() == victim) {
            // Parked only once every survivor is past the barrier, so the kill fails the
            // all-reduce under test rather than someone's barrier.
            for (int r = 0; r < comm.world_size(); ++r) {
              if (r != victim)
                CHILD_OK(comm.store()->Get("ready/" + std::to_string(r), 30s).status());
            }
            char b = 'x';
            CHILD_CHECK(::write(ready[1], &b, 1) == 1, "write");
            for (;;) ::pause();  // killed by the parent
          }
          CHILD_OK(comm.store()->Set("ready/" + std::to_string(comm.rank()), "1"));
          // Data flows through the victim in every ring step: all survivors must notice.
          std::vector<float> v(100000, 1.0f);
          Status s =
              comm.AllReduce(v.data(), v.data(), v.size(), CommDataType::kFloat32, ReduceOp::kSum)
                  .Wait();
          std::fprintf(stderr, "rank %d: %s\n", comm.rank(), s.ToString().c_str());
          CHILD_CHECK(!s.ok(), "all-reduce succeeded without rank %d", victim);
          CHILD_CHECK(s.code() == StatusCode::kComm || s.code() == StatusCode::kTimeout, "code %s",
                      StatusCodeName(s.code()));
          CHILD_CHECK(s.message().find("lost rank " + std::to_string(victim)) != std::string::npos,
                      "message does not name rank %d: %s", victim, s.message().c_str());
          Status later = comm.Barrier().Wait();
          CHILD_CHECK(later.code() == StatusCode::kAborted, "later: %s", later.ToString().c_str());
          return 0;
        },
        [&](const std::vector<pid_t>& pids) {
          ::close(ready[1]);
          char b;
          // The victim says it is parked; only then is it killed, mid-run for the others.
          if (::read(ready[0], &b, 1) == 1) ::kill(pids[victim], SIGKILL);
          ::close(ready[0]);
        },
        60s);
    for (int r = 0; r < world; ++r) {
      if (r == victim) {
        EXPECT_EQ(results[r].exit_code, -SIGKILL);
      } else {
        EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
      }
    }
  }
}

// A rank that stalls (SIGSTOP: alive, connections open, silent) makes the others fail
// with Timeout after about the comm timeout instead of hanging, naming it; the later
// collectives fail at once.
TEST(GlooCommunicator, StalledRankMakesOthersTimeOut) {
  const int world = 3, victim = 2;
  auto results = RunRanks(
      world, 2s,
      [&](Communicator& comm) {
        CHILD_OK(comm.Barrier().Wait());
        if (comm.rank() == victim) {
          for (int r = 0; r < comm.world_size(); ++r) {
            if (r != victim)
              CHILD_OK(comm.store()->Get("ready/" + std::to_string(r), 30s).status());
          }
          ::raise(SIGSTOP);
          return 0;
        }
        CHILD_OK(comm.store()->Set("ready/" + std::to_string(comm.rank()), "1"));
        std::vector<float> v(1000, 1.0f);
        Status s =
            comm.AllReduce(v.data(), v.data(), v.size(), CommDataType::kFloat32, ReduceOp::kSum)
                .Wait();
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), s.ToString().c_str());
        CHILD_CHECK(!s.ok(), "all-reduce succeeded without rank %d", victim);
        CHILD_CHECK(s.code() == StatusCode::kTimeout || s.code() == StatusCode::kComm, "code %s",
                    StatusCodeName(s.code()));
        // Named, with how long it was silent (not "no data from a peer").
        CHILD_CHECK(s.message().find("rank 2 sent nothing for 2 s") != std::string::npos,
                    "message does not name the stalled rank: %s", s.message().c_str());
        CHILD_CHECK(comm.Barrier().Wait().code() == StatusCode::kAborted, "later barrier");
        return 0;
      },
      nullptr, 60s, victim);
  for (int r = 0; r < world; ++r) {
    if (r != victim) {
      EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
    }
  }
}

TEST(GlooCommunicator, MissingRankTimesOutNamingIt) {
  TempDir dir;
  auto start = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(Options(dir.path(), 0, 3, 500ms));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kTimeout) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("rank(s) 1, 2 of 3 did not join"), std::string::npos)
      << comm.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // a hang guard, not a speed check
}

TEST(GlooCommunicator, StaleRendezvousFolderIsReported) {
  TempDir dir;
  {
    auto store = OpenKeyValueStore(FileRendezvous(dir.path()), "strata");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->Set("join/0", "1").ok());
  }
  Result<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(Options(dir.path(), 0, 2, 500ms));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("fresh folder"), std::string::npos);
}

TEST(GlooCommunicator, MissingRendezvousFolderIsNotFound) {
  Result<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(Options("/nonexistent/strata/rdzv", 0, 2, 500ms));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kNotFound) << comm.status().ToString();
  EXPECT_EQ(comm.status().path(), "/nonexistent/strata/rdzv");
}

// Ranks spanning hosts must not advertise a loopback address (Debian maps the host name
// to 127.0.1.1): refused at once with what to set.
TEST(GlooCommunicator, LoopbackHostIsRefusedWhenRanksSpanHosts) {
  TempDir dir;
  CommOptions o = Options(dir.path(), 0, 4, 500ms);
  o.rank.local_world_size = 2;
  o.hostname = "localhost";
  Result<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("STRATA_COMM_HOST"), std::string::npos);
}

TEST(GlooCommunicator, KeyValueStoreExchangesBytesAndTimesOut) {
  TempDir dir;
  auto store = OpenKeyValueStore(FileRendezvous(dir.path()), "kv");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::string id(128, '\0');  // like an ncclUniqueId: binary, with NULs
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7);
  ASSERT_TRUE((*store)->Set("nccl/id", id).ok());
  ASSERT_TRUE((*store)->Set("empty", "").ok());
  auto got = (*store)->Get("nccl/id", 1s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, id);
  auto empty = (*store)->Get("empty", 1s);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, "");
  auto missing = (*store)->Get("absent", 50ms);
  EXPECT_EQ(missing.status().code(), StatusCode::kTimeout);
  EXPECT_NE(missing.status().message().find("absent"), std::string::npos);
  EXPECT_EQ((*store)->Set("nccl/id", id).code(), StatusCode::kInvalidArgument);
}

TEST(GlooCommunicator, RedisRendezvousWithoutServerFailsCleanly) {
  auto spec = ParseRendezvous("redis:127.0.0.1:1");
  ASSERT_TRUE(spec.ok());
  auto store = OpenKeyValueStore(*spec, "strata");
  ASSERT_FALSE(store.ok());
  if (gloo_internal::HasRedis()) {
    EXPECT_EQ(store.status().code(), StatusCode::kIOError) << store.status().ToString();
    EXPECT_NE(store.status().message().find("redis://127.0.0.1:1"), std::string::npos)
        << store.status().ToString();
  } else {
    EXPECT_EQ(store.status().code(), StatusCode::kNotSupported) << store.status().ToString();
  }
}

TEST(GlooCommunicator, SingleRankRunsLocallyAndRejectsBadArguments) {
  TempDir dir;
  auto comm = CreateGlooCommunicator(Options(dir.path(), 0, 1));
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  std::vector<float> in = {1, 2, 3}, out(3);
  ASSERT_TRUE((*comm)
                  ->AllReduce(in.data(), out.data(), 3, CommDataType::kFloat32, ReduceOp::kAverage)
                  .Wait()
                  .ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE((*comm)
                  ->ReduceScatter(in.data(), out.data(), 3, CommDataType::kFloat32, ReduceOp::kSum)
                  .Wait()
                  .ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE((*comm)
                  ->ReduceScatter(in.data(), in.data(), 3, CommDataType::kFloat32, ReduceOp::kSum)
                  .Wait()
                  .ok());  // in place with one rank: nothing moves
  EXPECT_EQ(out, in);
  EXPECT_EQ((*comm)
                ->ReduceScatter(in.data(), in.data() + 1, 2, CommDataType::kFloat32, ReduceOp::kSum)
                .Wait()
                .code(),
            StatusCode::kInvalidArgument);  // overlapping, but not at rank * count
  EXPECT_EQ((*comm)
                ->ReduceScatter(in.data(), out.data(), 3, CommDataType::kByte, ReduceOp::kSum)
                .Wait()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)
                ->ReduceScatter(in.data(), out.data(), 3, CommDataType::kFloat32, ReduceOp::kMax)
                .Wait()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->Broadcast(in.data(), 3, CommDataType::kFloat32, 1).Wait().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->AllGather(nullptr, out.data(), 3, CommDataType::kFloat32).Wait().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->Barrier().Wait().ok());
}

}  // namespace
}  // namespace strata
