// Starting the ranks of a multi-rank `strata` run one by one (not through `strata launch`,
// which would stop the others itself), for tests that kill or watch single ranks.
// STRATA_CLI_PATH must be defined to the strata binary.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace strata::testing {

// Starts rank `rank` of `world` with a file rendezvous in `rdv`; stdout to a pipe
// (*out_fd), stderr to `err`. `env` entries ("NAME=value") are set for this rank only.
inline pid_t SpawnRank(int rank, int world, const std::string& rdv,
                       const std::vector<std::string>& args, int* out_fd, const std::string& err,
                       const std::vector<std::string>& env = {}) {
  int p[2];
  EXPECT_EQ(0, pipe(p));
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("STRATA_RENDEZVOUS", ("file:" + rdv).c_str(), 1);
    for (const std::string& e : env) {
      const size_t eq = e.find('=');
      setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
    }
    dup2(p[1], 1);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(e, 2);
    close(p[0]);
    close(p[1]);
    std::vector<std::string> a = args;
    std::vector<char*> argv = {const_cast<char*>(STRATA_CLI_PATH)};
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(STRATA_CLI_PATH, argv.data());
    _exit(127);
  }
  close(p[1]);
  *out_fd = p[0];
  return pid;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace strata::testing
