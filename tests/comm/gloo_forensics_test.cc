// The peer-loss forensics helpers (comm/gloo_forensics.h): naming a rank from a Gloo message,
// telling whether a process is gone, and listing this process's TCP endpoints.
#include "comm/gloo_forensics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace strata {
namespace {

using namespace std::chrono_literals;

TEST(FindRankInMessage, MatchesWholeAddressesOnly) {
  std::vector<std::vector<std::string>> eps = {
      {"[127.0.0.1]:40121", "[127.0.0.1]:50000"}, {"[127.0.0.1]:4012"}, {}};
  EXPECT_EQ(gloo_internal::FindRankInMessage("Connection closed by peer [127.0.0.1]:4012", eps), 1);
  EXPECT_EQ(gloo_internal::FindRankInMessage("Read error [127.0.0.1]:40121: reset", eps), 0);
  EXPECT_EQ(gloo_internal::FindRankInMessage("Read error [127.0.0.1]:50000: reset", eps), 0);
  EXPECT_EQ(gloo_internal::FindRankInMessage("Timed out waiting 3000ms", eps), std::nullopt);
}

TEST(ProcessIsGone, TellsLiveZombieAndReapedProcessesApart) {
  std::string me = gloo_internal::ProcessIdentity();
  EXPECT_FALSE(gloo_internal::ProcessIsGone(me)) << me;
  pid_t pid = ::fork();
  if (pid == 0) {
    for (;;) ::pause();
  }
  ASSERT_GT(pid, 0);
  auto stat_of = [](pid_t p) {
    std::ifstream f("/proc/" + std::to_string(p) + "/stat");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  std::istringstream in(me);
  std::string host;
  in >> host;
  std::string child =
      host + " " + std::to_string(pid) + " " + gloo_internal::StartTimeFromStat(stat_of(pid));
  EXPECT_FALSE(gloo_internal::ProcessIsGone(child)) << child;
  EXPECT_FALSE(gloo_internal::ProcessIsGone("other-host " + std::to_string(pid) + " 1"));
  ::kill(pid, SIGKILL);
  // Not reaped yet: a zombie counts as gone.
  for (int i = 0; i < 2000 && stat_of(pid).find(") Z") == std::string::npos; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(gloo_internal::ProcessIsGone(child)) << stat_of(pid);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(gloo_internal::ProcessIsGone(child));
  EXPECT_EQ(gloo_internal::StartTimeFromStat("garbage"), "");
}

// A process that exits and is reaped while its stat file is being read: ProcessIsGone says
// gone (reading such a file fails with ESRCH, which once escaped as a C++ exception and
// terminated a surviving rank). Children are reaped by another thread while this one asks.
TEST(ProcessIsGone, AProcessReapedWhileItIsReadIsGone) {
  std::string host;
  std::istringstream(gloo_internal::ProcessIdentity()) >> host;
  for (int i = 0; i < 200; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::usleep(200 + 50 * (i % 20));
      ::_exit(0);
    }
    ASSERT_GT(pid, 0);
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string child =
        host + " " + std::to_string(pid) + " " + gloo_internal::StartTimeFromStat(stat);
    std::thread reaper([pid] { ::waitpid(pid, nullptr, 0); });
    bool gone = false;
    for (int k = 0; k < 100000 && !gone; ++k) gone = gloo_internal::ProcessIsGone(child);
    reaper.join();
    EXPECT_TRUE(gone || gloo_internal::ProcessIsGone(child)) << child;
  }
}

TEST(LocalTcpEndpoints, ListsAListeningSocketOfThisProcess) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::string want = "[127.0.0.1]:" + std::to_string(ntohs(a.sin_port));
  std::vector<std::string> eps = gloo_internal::LocalTcpEndpoints();
  ::close(fd);
  EXPECT_NE(std::find(eps.begin(), eps.end(), want), eps.end()) << want;
}

}  // namespace
}  // namespace strata
