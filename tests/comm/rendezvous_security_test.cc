// The rendezvous against a hostile client (issue 45, round 4): a Redis server with a password
// (requirepass, ACL users), keys planted in the rendezvous before a run starts, forged Gloo
// endpoints, a rank that joins without the run's secret, and a rank asked to stop while it
// waits for the others. Every server is a real redis-server on 127.0.0.1 that the test starts;
// every rank a forked process talking over loopback.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm.h"
#include "tests/comm/forked_ranks.h"
#include "tests/tools/redis_server.h"

namespace strata {
namespace {

using namespace std::chrono_literals;
using testing::RedisServer;

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// redis-cli's output without its trailing newlines ("" for an empty list).
std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// A message that reached the user must not be one of Gloo's assertions.
bool NoAssertionText(const std::string& m) {
  return !Has(m, "sizeof(") && !Has(m, "==") && !Has(m, "GLOO_ENFORCE") && !Has(m, ".cc:");
}

class RedisFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServer::Binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    std::string why;
    ASSERT_TRUE(server_.Start(&why)) << why;
  }
  RendezvousSpec Spec(const std::string& prefix, const std::string& secret = "") const {
    Result<RendezvousSpec> spec = ParseRendezvous(server_.Url(prefix));
    EXPECT_TRUE(spec.ok());
    spec->run_secret = secret;
    return *spec;
  }
  RedisServer server_;
};

// ---------------------------------------------------------------------------------------
// AUTH: requirepass and ACL users
// ---------------------------------------------------------------------------------------

class RedisAuth : public RedisFixture {
 protected:
  void SetUp() override {
    if (RedisServer::Binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    server_.cli_password = "s3cret";
    std::string why;
    ASSERT_TRUE(server_.Start(&why, "127.0.0.1", "", "--requirepass s3cret")) << why;
    ::unsetenv("STRATA_REDIS_PASSWORD");
  }
  void TearDown() override { ::unsetenv("STRATA_REDIS_PASSWORD"); }
  std::string Url(const std::string& userinfo) const {
    return "redis://" + userinfo + "127.0.0.1:" + std::to_string(server_.port()) + "/auth";
  }
  static Status RoundTrip(const std::string& url) {
    Result<RendezvousSpec> spec = ParseRendezvous(url);
    if (!spec.ok()) return spec.status();
    Result<std::shared_ptr<KeyValueStore>> kv = OpenKeyValueStore(*spec, "t");
    if (!kv.ok()) return kv.status();
    STRATA_RETURN_IF_ERROR((*kv)->Set("k", "value"));
    Result<std::string> back = (*kv)->Get("k", 1s);
    if (!back.ok()) return back.status();
    return *back == "value" ? Status::OK() : Status::Corruption("read back '" + *back + "'");
  }
};

TEST_F(RedisAuth, NoPasswordIsReportedAsAuthenticationNotAsAServerThatStopped) {
  Status s = RoundTrip(Url(""));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Has(s.message(), "authentication needed")) << s.ToString();
  EXPECT_TRUE(Has(s.message(), "NOAUTH")) << s.ToString();
  EXPECT_TRUE(Has(s.message(), "STRATA_REDIS_PASSWORD")) << s.ToString();
  EXPECT_FALSE(Has(s.message(), "stopped answering")) << s.ToString();
  EXPECT_TRUE(NoAssertionText(s.message())) << s.ToString();
}

TEST_F(RedisAuth, PasswordInTheUrlOrTheEnvironment) {
  EXPECT_TRUE(RoundTrip(Url(":s3cret@")).ok()) << RoundTrip(Url(":s3cret@")).ToString();
  Status wrong = RoundTrip(Url(":wrong@"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(Has(wrong.message(), "authentication failed")) << wrong.ToString();
  EXPECT_FALSE(Has(wrong.message(), "wrong")) << "the password leaked: " << wrong.ToString();
  ::setenv("STRATA_REDIS_PASSWORD", "s3cret", 1);
  EXPECT_TRUE(RoundTrip(Url("")).ok()) << RoundTrip(Url("")).ToString();
}

TEST_F(RedisAuth, AclUser) {
  ASSERT_EQ(server_.Cli("ACL SETUSER alice on '>p@ss/word' '~*' '+@all'"), "OK\n");
  // '@' and '/' in the password: escaped as %40 and %2F.
  Status ok = RoundTrip(Url("alice:p%40ss%2Fword@"));
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  Status wrong = RoundTrip(Url("alice:nope@"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(Has(wrong.message(), "authentication failed")) << wrong.ToString();
  EXPECT_TRUE(Has(wrong.message(), "alice")) << wrong.ToString();
}

// ---------------------------------------------------------------------------------------
// Hostile clients: planted keys, forged endpoints, a join without the secret
// ---------------------------------------------------------------------------------------

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

// Forks `world` ranks, rank r meeting through specs[r]; each all-reduces (r + 1) and checks
// the sum. Returns the exit codes (0 = joined and summed right); `on_error(rank, status)`
// decides the code of a rank whose join failed.
std::vector<int> RunAllReduce(const std::vector<RendezvousSpec>& specs,
                              std::chrono::milliseconds timeout,
                              const std::function<int(int, const Status&)>& on_error,
                              std::chrono::milliseconds last_rank_timeout = 0ms) {
  const int world = static_cast<int>(specs.size());
  return testing::ForkChildren(
      world,
      [&](int r) {
        CommOptions o;
        o.rank = RankInfo{r, world, r, world, "test"};
        o.rendezvous = specs[r];
        o.timeout = r == world - 1 && last_rank_timeout > 0ms ? last_rank_timeout : timeout;
        Result<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(o);
        if (!comm.ok()) return on_error(r, comm.status());
        float v = static_cast<float>(r + 1);
        Status s = (*comm)->AllReduce(&v, &v, 1, CommDataType::kFloat32, ReduceOp::kSum, {}).Wait();
        if (!s.ok()) {
          std::fprintf(stderr, "rank %d: all-reduce: %s\n", r, s.ToString().c_str());
          return 2;
        }
        return v == static_cast<float>(world * (world + 1) / 2) ? 0 : 3;
      },
      {.deadline = 60s, .before_wait = nullptr, .kill_last = -1});
}

int Unexpected(int r, const Status& s) {
  std::fprintf(stderr, "rank %d: join failed: %s\n", r, s.ToString().c_str());
  return 90;
}

// What a client without the run's secret writes: strata's own format, unsigned.
std::shared_ptr<KeyValueStore> Intruder(RendezvousSpec spec, const std::string& prefix,
                                        const std::string& secret = "") {
  spec.run_secret = secret;
  Result<std::shared_ptr<KeyValueStore>> kv = OpenKeyValueStore(spec, prefix);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  return kv.ok() ? *kv : nullptr;
}

class HostileRendezvous : public RedisFixture {};

TEST_F(HostileRendezvous, PlantedJoinKeysAndForgedEndpointsDoNotStopARunWithASecret) {
  const RendezvousSpec spec = Spec("planted", kSecret);
  // Planted before the run: join keys that the old code took for joined ranks, and Gloo
  // endpoints that are not addresses at all (kept alive: the intruder stays connected).
  auto joins = Intruder(spec, "strata");
  auto gloo = Intruder(spec, "strata/gloo");
  ASSERT_TRUE(joins && gloo);
  ASSERT_TRUE(joins->Set("join/0", "1").ok());
  ASSERT_TRUE(joins->Set("join/1", "1").ok());
  ASSERT_TRUE(gloo->Set("1", "forged endpoints").ok());
  const std::vector<int> codes = RunAllReduce({spec, spec}, 20s, Unexpected);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_F(HostileRendezvous, PlantedKeysInAFolderDoNotStopARunWithASecret) {
  TempDir dir;
  RendezvousSpec spec = FileRendezvous(dir.path());
  spec.run_secret = kSecret;
  auto joins = Intruder(spec, "strata");
  ASSERT_TRUE(joins);
  ASSERT_TRUE(joins->Set("join/1", "1").ok());
  const std::vector<int> codes = RunAllReduce({spec, spec}, 20s, Unexpected);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_F(HostileRendezvous, ForgedGlooEndpointsWithoutASecretNameTheKeyNotAnAssertion) {
  const RendezvousSpec spec = Spec("forged");
  auto gloo = Intruder(spec, "strata/gloo");
  ASSERT_TRUE(gloo);
  ASSERT_TRUE(gloo->Set("1", "forged endpoints").ok());
  const std::vector<int> codes = RunAllReduce({spec, spec}, 10s, [](int r, const Status& s) {
    const std::string m = s.message();
    std::fprintf(stderr, "rank %d: %s\n", r, s.ToString().c_str());
    // Rank 0 reads the forged key; rank 1 fails on it (its own key is taken) or on rank 0
    // having gone: either way without Gloo's assertions or a server said to be gone.
    if (!NoAssertionText(m) || Has(m, "stopped answering")) return 1;
    return r == 1 || Has(m, "key 'forged/strata/gloo/1'") ? 10 : 1;
  });
  EXPECT_EQ(codes, (std::vector<int>{10, 10}));
}

TEST_F(HostileRendezvous, AJoinWithoutTheSecretIsRefusedNamingTheKey) {
  // Rank 1 comes without the secret (or with another): rank 0 does not take it for its peer.
  for (const std::string intruder_secret : {"", "another run's secret"}) {
    SCOPED_TRACE("intruder's secret: '" + intruder_secret + "'");
    const std::string prefix = intruder_secret.empty() ? "nosecret" : "othersecret";
    const RendezvousSpec mine = Spec(prefix, kSecret);
    const RendezvousSpec theirs = Spec(prefix, intruder_secret);
    // 10: refused as it should be (0 would be a run that took the intruder in).
    const std::vector<int> codes = RunAllReduce(
        {mine, theirs}, 4s,
        [&](int r, const Status& s) {
          std::fprintf(stderr, "rank %d: %s\n", r, s.ToString().c_str());
          if (!NoAssertionText(s.message())) return 1;
          // The intruder: refused at once when it has no secret (rank 0's key is signed), else
          // it waits in vain for a rank 0 that verifies with its secret.
          if (r == 1) {
            return intruder_secret.empty() ? (Has(s.message(), prefix + "/strata/join/0") ? 10 : 1)
                                           : (s.code() == StatusCode::kTimeout ? 10 : 1);
          }
          // Rank 0 never takes the intruder for rank 1; a key of the intruder's that is still
          // there when it gives up is named.
          if (s.code() != StatusCode::kTimeout || !Has(s.message(), "rank(s) 1 of 2")) return 1;
          return intruder_secret.empty() ||
                         Has(s.message(), "key '" + prefix + "/strata/join/1' was refused")
                     ? 10
                     : 1;
        },
        8s);  // the intruder waits longer, so that its key is there when rank 0 gives up
    EXPECT_EQ(codes, (std::vector<int>{10, 10}));
    EXPECT_EQ(Trim(server_.Cli("KEYS '" + prefix + "/*'")), "") << "keys left behind";
  }
}

TEST_F(HostileRendezvous, ARankWithTheSecretTakesItsKeyBackFromAnIntruder) {
  const RendezvousSpec spec = Spec("takeover", kSecret);
  // The intruder joined first as rank 1, with another secret, and stays.
  auto intruder = Intruder(spec, "strata", "not the run's secret");
  ASSERT_TRUE(intruder);
  ASSERT_TRUE(intruder->Set("join/1", "1").ok());
  const std::vector<int> codes = RunAllReduce({spec, spec}, 20s, Unexpected);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// ---------------------------------------------------------------------------------------
// A rank asked to stop while it waits for the others
// ---------------------------------------------------------------------------------------

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

// Rank 0 of 2 waits for a rank 1 that never comes; SIGTERM must end the wait at once (the
// handler only sets a flag, as the CLI's does) and the rank's keys must be gone.
void InterruptWhileWaiting(const RendezvousSpec& spec, const std::function<bool()>& keys_present) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int> codes = testing::ForkChildren(
      1,
      [&](int) {
        struct sigaction sa = {};
        sa.sa_handler = OnSignal;
        sa.sa_flags = SA_RESTART;
        ::sigaction(SIGTERM, &sa, nullptr);
        SetRendezvousInterruptCheck([] { return g_signal.load(); });
        CommOptions o;
        o.rank = RankInfo{0, 2, 0, 2, "test"};
        o.rendezvous = spec;
        o.timeout = 120s;
        Result<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(o);
        std::fprintf(stderr, "rank 0: %s\n", comm.status().ToString().c_str());
        return !comm.ok() && comm.status().code() == StatusCode::kAborted &&
                       Has(comm.status().message(), "SIGTERM")
                   ? 0
                   : 1;
      },
      {.deadline = 30s,
       .before_wait =
           [&](const std::vector<pid_t>& pids) {
             for (int i = 0; i < 500 && !keys_present(); ++i) std::this_thread::sleep_for(10ms);
             EXPECT_TRUE(keys_present()) << "rank 0 never published its join key";
             ::kill(pids[0], SIGTERM);
           },
       .kill_last = -1});
  EXPECT_EQ(codes, std::vector<int>{0});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "the wait was not interrupted";
  EXPECT_FALSE(keys_present()) << "the interrupted rank left its keys behind";
}

TEST_F(HostileRendezvous, SigtermEndsTheWaitForRanksAndDeletesTheKeysInRedis) {
  InterruptWhileWaiting(Spec("sigterm", kSecret),
                        [&] { return Trim(server_.Cli("KEYS 'sigterm/*'")) != ""; });
}

TEST_F(HostileRendezvous, SigtermEndsTheWaitForRanksAndDeletesTheKeysInAFolder) {
  TempDir dir;
  RendezvousSpec spec = FileRendezvous(dir.path());
  InterruptWhileWaiting(spec, [&] {
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
      if (e.is_regular_file()) return true;
    }
    return false;
  });
}

}  // namespace
}  // namespace strata
