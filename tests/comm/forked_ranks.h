// Forked Gloo ranks for the comm tests: each rank is a child process (tests/forked_children.h)
// that meets the others through a FileStore in a fresh temporary folder and talks over
// loopback TCP. The parent reaps them with a deadline: a rank still running then is killed and
// reported as a hang.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm.h"
#include "tests/forked_children.h"
#include "tests/temp_dir.h"

namespace strata {

inline RendezvousSpec FileRendezvous(const std::string& dir) {
  RendezvousSpec spec;
  spec.kind = RendezvousSpec::Kind::kFile;
  spec.path = dir;
  return spec;
}

// A fresh folder under /var/tmp, removed at the end.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("strata_comm_test") {}
};

inline CommOptions Options(const std::string& dir, int rank, int world,
                           std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  CommOptions o;
  o.rank.rank = rank;
  o.rank.world_size = world;
  o.rank.local_rank = rank;
  o.rank.local_world_size = world;
  o.rendezvous.kind = RendezvousSpec::Kind::kFile;
  o.rendezvous.path = dir;
  o.timeout = timeout;
  return o;
}

// What a child reports back: its exit code (0 = all checks passed) and its stderr.
struct ChildResult {
  int exit_code = -1;  // -signal when killed
};

// Forks `world` ranks (tests/forked_children.h); each builds a communicator and runs `body`
// (returning an exit code). `before_wait(pids)` runs in the parent after forking. Rank
// `kill_last` (if >= 0) is killed once every other rank has exited. Ranks still alive at
// `deadline` are killed and reported as -SIGKILL (the test then fails on them).
inline std::vector<ChildResult> RunRanks(
    int world, std::chrono::milliseconds comm_timeout,
    const std::function<int(Communicator&)>& body,
    const std::function<void(const std::vector<pid_t>&)>& before_wait = nullptr,
    std::chrono::seconds deadline = std::chrono::seconds(120), int kill_last = -1) {
  TempDir dir;
  const std::vector<int> codes = testing::ForkChildren(
      world,
      [&](int r) {
        Result<std::unique_ptr<Communicator>> comm =
            CreateGlooCommunicator(Options(dir.path(), r, world, comm_timeout));
        if (!comm.ok()) {
          std::fprintf(stderr, "rank %d: create: %s\n", r, comm.status().ToString().c_str());
          return 90;
        }
        return body(**comm);
      },
      {.deadline = deadline, .before_wait = before_wait, .kill_last = kill_last});
  std::vector<ChildResult> results(world);
  for (int r = 0; r < world; ++r) results[r].exit_code = codes[r];
  return results;
}

// In a rank's body (a `comm` in scope): on a failed check, prints it (and the printf-style
// message, when given) and returns 1 from the body.
#define CHILD_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "rank %d: check failed: %s", comm.rank(), #cond);     \
      __VA_OPT__(std::fprintf(stderr, ": "); std::fprintf(stderr, __VA_ARGS__);) \
      std::fprintf(stderr, "\n");                                                \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

#define CHILD_OK(expr)                                              \
  do {                                                              \
    Status s_ = (expr);                                             \
    CHILD_CHECK(s_.ok(), "%s -> %s", #expr, s_.ToString().c_str()); \
  } while (0)

}  // namespace strata
