// Child processes forked by a test, each running a piece of the test and exiting with its
// result, reaped with a deadline so that a hang fails the test instead of stalling the suite.
// The multi-rank tests (one child per rank) build on it: tests/comm/forked_ranks.h,
// tests/comm/messages_test.cc, tests/engine/engine_multirank_test.cc.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

namespace strata::testing {

struct ForkOptions {
  // Children still running then are killed and reported (ADD_FAILURE) as a hang.
  std::chrono::seconds deadline{120};
  // Runs in the parent once every child is forked (for example to kill one at a chosen point).
  std::function<void(const std::vector<pid_t>&)> before_wait;
  // When >= 0: this child is killed once every other child has exited (one that stalls on
  // purpose).
  int kill_last = -1;
};

// Forks `n` children; child i runs body(i) and exits with its return value (stdout and stderr
// flushed first, no destructors of the parent's objects run). Returns each child's exit code,
// or -signal for one that was killed (-SIGKILL for one killed at the deadline).
inline std::vector<int> ForkChildren(int n, const std::function<int(int)>& body,
                                     const ForkOptions& options = {}) {
  std::vector<pid_t> pids;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int code = body(i);
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  if (options.before_wait) options.before_wait(pids);
  std::vector<int> codes(n, -1);
  std::vector<bool> done(n, false);
  const auto end = std::chrono::steady_clock::now() + options.deadline;
  int remaining = n;
  while (remaining > 0) {
    for (int i = 0; i < n; ++i) {
      int st = 0;
      if (!done[i] && ::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        done[i] = true;
        --remaining;
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      }
    }
    if (remaining == 0) break;
    const int last = options.kill_last;
    if (last >= 0 && remaining == 1 && !done[last]) ::kill(pids[last], SIGKILL);
    if (std::chrono::steady_clock::now() > end) {
      for (int i = 0; i < n; ++i) {
        if (done[i]) continue;
        ADD_FAILURE() << "child " << i << " still running after the deadline: a hang";
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
        codes[i] = -SIGKILL;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

}  // namespace strata::testing
