// RedisServer: a real redis-server for the rendezvous tests, started on a free port of a
// given address (127.0.0.1 by default) and stopped (SIGTERM, then SIGKILL) when the object
// goes away. Nothing is persisted (no RDB, no AOF). `prefix` runs it inside something, e.g.
// "ip netns exec NAME" for the network-namespace test. Header-only; for tests only. Not safe
// for concurrent use; one object per server.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace strata::testing {

class RedisServer {
 public:
  // The redis-server binary, or "" when it is not installed (tools/bootstrap.sh installs it).
  static std::string Binary() {
    for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
      if (::access(p, X_OK) == 0) return p;
    }
    return "";
  }

  RedisServer() = default;
  ~RedisServer() { Stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts the server on a free port of `bind` and waits (5 s at most) until it answers
  // PING through redis-cli. Returns false (with *why) when it did not come up. `extra`:
  // more redis-server arguments; with "--requirepass PW", set cli_password (below) first.
  bool Start(std::string* why, const std::string& bind = "127.0.0.1",
             const std::string& prefix = "", const std::string& extra = "") {
    bind_ = bind;
    prefix_ = prefix;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = FreePort();
      pid_ = ::fork();
      if (pid_ == 0) {
        ::setpgid(0, 0);
        const std::string cmd = prefix + (prefix.empty() ? "" : " ") + Binary() + " --port " +
                                std::to_string(port_) + " --bind " + bind +
                                " --save '' --appendonly no --protected-mode no "
                                "--loglevel warning --logfile /dev/null " +
                                extra;
        ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      for (int i = 0; i < 100; ++i) {
        if (Cli("PING") == "PONG\n") return true;
        int st = 0;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
          pid_ = -1;
          break;  // the port was taken after all: try another
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      Stop();
    }
    *why = "redis-server did not start on " + bind + " (5 attempts)";
    return false;
  }

  // Stops the server (and waits for it). Safe to call twice.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // redis-cli's output for `command` sent to this server (e.g. "SET k v", "KEYS *").
  std::string Cli(const std::string& command) const {
    std::string cmd = prefix_ + (prefix_.empty() ? "" : " ") + "timeout -s KILL 5 redis-cli -h " +
                      bind_ + " -p " + std::to_string(port_) +
                      (cli_password.empty() ? "" : " --no-auth-warning -a " + cli_password) + " " +
                      command + " 2>/dev/null";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }

  int port() const { return port_; }
  // The password Cli authenticates with (a server started with --requirepass).
  std::string cli_password;
  // The rendezvous flag value for a run with key prefix `prefix`.
  std::string Url(const std::string& prefix) const {
    return "redis://" + bind_ + ":" + std::to_string(port_) + "/" + prefix;
  }

 private:
  // A port the kernel just handed out on loopback (free now; the server may still lose a
  // race for it, which Start retries).
  static int FreePort() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string bind_, prefix_;
};

}  // namespace strata::testing
