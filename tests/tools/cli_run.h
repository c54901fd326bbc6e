// RunCli: runs the built `strata` binary as a test's subject, through the shell (popen) with
// a hang guard (coreutils `timeout -s KILL`), and returns its exit code and what it printed.
// Header-only, for the CLI's end-to-end tests (tests/tools/, tests/trainer/); the binary is the
// STRATA_CLI_PATH compile definition their CMakeLists.txt set. Each call is independent;
// safe to call from any test thread, though the command sees this process's environment.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#ifndef STRATA_CLI_PATH
#error "tests/tools/cli_run.h needs STRATA_CLI_PATH: the path of the built strata binary"
#endif

namespace strata::testing {

// Where the command's standard error goes.
enum class CliStderr {
  kMerged,     // into CliRun::output, interleaved with standard output (2>&1)
  kDiscarded,  // to /dev/null
  kFile,       // to CliRunOptions::stderr_path (created or truncated), read back into CliRun::err
};

struct CliRunOptions {
  CliStderr stderr_to = CliStderr::kMerged;
  std::string stderr_path;  // with kFile; a file name the shell takes as is
  // Seconds before the command is killed (SIGKILL): a hang then fails the test with exit
  // code 137 instead of blocking the suite until CTest's own timeout.
  int timeout_s = 120;
  // Variables removed from the command's environment, e.g. the rank variables of a
  // launcher the tests themselves run under, for a run that must be one rank.
  std::vector<std::string> unset_env;
};

struct CliRun {
  // The command's exit status; 137 (128 + SIGKILL) when the timeout stopped it; -1 when it
  // could not be started or died by a signal the guard did not send.
  int exit_code = -1;
  std::string output;  // standard output (and standard error with CliStderr::kMerged)
  std::string err;     // standard error with CliStderr::kFile, else ""
};

// Runs `strata <args>` as options say and waits for it. `args` is shell text, appended as
// is: quote values that may hold spaces or shell characters (ShellQuote).
inline CliRun RunCli(const std::string& args, const CliRunOptions& options = {}) {
  std::string cmd;
  if (!options.unset_env.empty()) {
    cmd = "env";
    for (const std::string& name : options.unset_env) cmd += " -u " + name;
    cmd += " ";
  }
  cmd +=
      "timeout -s KILL " + std::to_string(options.timeout_s) + " " + STRATA_CLI_PATH + " " + args;
  switch (options.stderr_to) {
    case CliStderr::kMerged:
      cmd += " 2>&1";
      break;
    case CliStderr::kDiscarded:
      cmd += " 2>/dev/null";
      break;
    case CliStderr::kFile:
      cmd += " 2>" + options.stderr_path;
      break;
  }
  CliRun run;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) run.output.append(buf.data(), n);
  const int status = ::pclose(p);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (options.stderr_to == CliStderr::kFile) {
    std::ifstream f(options.stderr_path);
    run.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return run;
}

// " 'a' 'b c'": each argument single-quoted for the shell (a ' inside becomes '\''), with a
// space before each, ready to append to RunCli's `args`.
inline std::string ShellQuote(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) {
    s += " '";
    for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
    s += "'";
  }
  return s;
}

inline bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

}  // namespace strata::testing
