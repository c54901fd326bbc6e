// Two "hosts" on one machine: two network namespaces joined by a veth pair with private
// addresses, a redis-server in the first as the rendezvous, and one `strata launch --nnodes 2
// --node-rank K` per namespace (2 ranks each, Gloo on the veth's address through
// --comm-interface). The 2-host x 2-rank run of `strata train` must equal one rank's losses
// within 1e-5 and a rerun bit for bit, and the bytes must have crossed the veth. Each rank
// sees only its namespace's interfaces, so the traffic cannot take a shortcut through the
// machine's own loopback. Skipped, saying why, when this process cannot create network
// namespaces (not root, or no CAP_SYS_ADMIN in a container) or redis-server is missing.
// Every command is bounded (timeout); TearDown removes the namespaces (and with them the
// veth pair) and stops the server.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tests/tools/redis_server.h"

namespace strata {
namespace {

using testing::CliRun;

const std::string kCli = STRATA_CLI_PATH;

// Runs `cmd` through the shell with a 20 s bound; its exit status.
int Sh(const std::string& cmd) {
  const int st = std::system(("timeout -s KILL 20 sh -c '" + cmd + "' >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Runs `cmd` through the shell, standard error merged; its exit code and output.
CliRun Shell(const std::string& cmd) {
  CliRun run;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) run.output.append(buf, n);
  const int st = ::pclose(p);
  run.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return run;
}

// Bytes received by interface `dev` in namespace `ns` (from sysfs inside it), or -1.
long long RxBytes(const std::string& ns, const std::string& dev) {
  FILE* p = ::popen(("timeout -s KILL 10 ip netns exec " + ns + " cat /sys/class/net/" + dev +
                     "/statistics/rx_bytes 2>/dev/null")
                        .c_str(),
                    "r");
  if (p == nullptr) return -1;
  long long v = -1;
  if (std::fscanf(p, "%lld", &v) != 1) v = -1;
  ::pclose(p);
  return v;
}

class NetnsHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::RedisServer::Binary().empty()) {
      GTEST_SKIP() << "redis-server is not installed (tools/bootstrap.sh installs it)";
    }
    const std::string id = std::to_string(::getpid() % 100000);
    ns_[0] = "strata-h0-" + id;
    ns_[1] = "strata-h1-" + id;
    veth_[0] = "sv0-" + id;  // interface names are at most 15 characters
    veth_[1] = "sv1-" + id;
    const int subnet = 16 + ::getpid() % 200;
    addr_[0] = "10.231." + std::to_string(subnet) + ".1";
    addr_[1] = "10.231." + std::to_string(subnet) + ".2";
    if (Sh("ip netns add " + ns_[0]) != 0) {
      GTEST_SKIP() << "cannot create a network namespace (`ip netns add` failed: needs root "
                      "with CAP_SYS_ADMIN, and iproute2)";
    }
    created_ = true;
    ASSERT_EQ(Sh("ip netns add " + ns_[1]), 0);
    ASSERT_EQ(Sh("ip link add " + veth_[0] + " type veth peer name " + veth_[1]), 0)
        << "cannot create a veth pair";
    for (int h = 0; h < 2; ++h) {
      const std::string in = "ip -n " + ns_[h] + " ";
      ASSERT_EQ(Sh("ip link set " + veth_[h] + " netns " + ns_[h]), 0);
      ASSERT_EQ(Sh(in + "addr add " + addr_[h] + "/24 dev " + veth_[h]), 0);
      ASSERT_EQ(Sh(in + "link set " + veth_[h] + " up"), 0);
      ASSERT_EQ(Sh(in + "link set lo up"), 0);
    }
    std::string why;
    ASSERT_TRUE(redis_.Start(&why, addr_[0], "ip netns exec " + ns_[0])) << why;
    // Host 1 reaches the server on host 0 over the veth (bounded: 10 tries of 0.2 s).
    ASSERT_EQ(Sh("for i in 1 2 3 4 5 6 7 8 9 10; do ip netns exec " + ns_[1] +
                 " bash -c \"exec 3<>/dev/tcp/" + addr_[0] + "/" + std::to_string(redis_.port()) +
                 "\" && exit 0; sleep 0.2; done; exit 1"),
              0)
        << "the namespaces do not reach each other over the veth pair";
  }

  void TearDown() override {
    redis_.Stop();
    if (created_) {
      // Deleting a namespace deletes the veth end in it, and so the pair.
      Sh("ip netns del " + ns_[0]);
      Sh("ip netns del " + ns_[1]);
    }
  }

  // One launch per namespace, 2 ranks each, meeting in Redis under `prefix`; rank 0's
  // per-step losses (empty when a launch failed; the outputs go to the test's log).
  std::vector<double> TwoHosts(const std::string& model, const std::string& prefix) {
    const std::string json = dir_.File(prefix + ".json");
    CliRun run[2];
    auto host = [&](int h) {
      // The namespace wraps the whole launch (`strata launch ... -- ip netns exec` would
      // move only the ranks); the launcher variables of an outer run are not passed on.
      run[h] = Shell(
          "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u "
          "STRATA_RENDEZVOUS -u STRATA_COMM_HOST -u GLOO_SOCKET_IFNAME -u MASTER_ADDR "
          "timeout -s KILL 140 ip netns exec " +
          ns_[h] + " " + kCli + " launch -n 2 --nnodes 2 --node-rank " + std::to_string(h) +
          " --comm-interface " + veth_[h] + " --rendezvous " + redis_.Url(prefix) + " -- " + kCli +
          " " + model + (h == 0 ? " --json " + json : ""));
    };
    std::thread second(host, 1);
    host(0);
    second.join();
    EXPECT_EQ(run[0].exit_code, 0) << run[0].output;
    EXPECT_EQ(run[1].exit_code, 0) << run[1].output;
    std::vector<double> losses;
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (!j.is_object()) return losses;
    EXPECT_EQ(j["config"]["world_size"], 4);
    for (const auto& s : j["steps"]) losses.push_back(s["loss"].get<double>());
    return losses;
  }

  std::string ns_[2], veth_[2], addr_[2];
  bool created_ = false;
  testing::RedisServer redis_;
  testing::TempDir dir_{"strata-netns"};
};

TEST_F(NetnsHostsTest, TwoHostsOfTwoRanksTrainLikeOneRankAndLikeARerun) {
  const std::string model =
      "train --layers 2 --d-model 32 --heads 2 --seq-len 16 --batch 8 --micro-batches 2 "
      "--steps 6 --lr 3e-3 --grad-clip 0.5 --comm-timeout 60";
  testing::CliRunOptions o;
  o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  const CliRun one = testing::RunCli(model + " --json " + dir_.File("one.json"), o);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::vector<double> reference;
  {
    std::ifstream f(dir_.File("one.json"));
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_object()) {
      for (const auto& s : j["steps"]) reference.push_back(s["loss"].get<double>());
    }
  }
  const long long rx_before = RxBytes(ns_[1], veth_[1]);
  const std::vector<double> first = TwoHosts(model, "run1");
  const long long rx_after = RxBytes(ns_[1], veth_[1]);
  const std::vector<double> second = TwoHosts(model, "run2");
  ASSERT_EQ(reference.size(), 6u);
  ASSERT_EQ(first.size(), 6u);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(first[i], reference[i], 1e-5 * std::abs(reference[i])) << "step " << i + 1;
  }
  EXPECT_EQ(first, second) << "a rerun of the 2-host run is not bit-identical";
  // The parameters' gathers alone move far more than 100 KB between the hosts per run.
  EXPECT_GT(rx_after - rx_before, 100000) << "little traffic crossed the veth pair";
  EXPECT_EQ(redis_.Cli("DBSIZE"), "0\n") << "the runs left keys in Redis";
}

}  // namespace
}  // namespace strata
