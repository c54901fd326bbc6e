// Interruption of a run; see interrupt.h.
#include "tools/strata/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string_view>

#include "strata/comm.h"
#include "strata/env.h"

namespace strata::cli {
namespace {

std::atomic<int> g_signal{0};
std::vector<std::string> g_argv;

void OnSignal(int sig) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) {
    const char msg[] =
        "\nstrata: interrupted; finishing the current step (press Ctrl-C again to abort at "
        "once)\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    return;
  }
  // The second signal: the default action, now.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::string Quote(const std::string& a) {
  if (!a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,+@%") == std::string::npos) {
    return a;
  }
  std::string q = "'";
  for (char c : a) {
    if (c == '\'') {
      q.append("'\\''");
    } else {
      q.push_back(c);
    }
  }
  q.push_back('\'');
  return q;
}

// A variable set by the launcher (not a STRATA_* one), or `fallback`.
std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// How many arguments from argv[i] on a printed command leaves out: `flag VALUE` or
// `flag=VALUE` for each flag in `flags`, else 0.
size_t ArgsToDrop(size_t i, std::initializer_list<std::string_view> flags) {
  const std::string& a = g_argv[i];
  for (std::string_view flag : flags) {
    if (a == flag) return i + 1 < g_argv.size() ? 2 : 1;
    if (a.size() > flag.size() && a.compare(0, flag.size(), flag) == 0 && a[flag.size()] == '=') {
      return 1;
    }
  }
  return 0;
}

// A run secret given on the command line is never printed again (logs keep what ps showed
// for a moment): a printed command omits it, and the hint says how to give it.
constexpr std::string_view kSecretFlag = "--run-secret";

}  // namespace

void SetCommandLine(int argc, char** argv) { g_argv.assign(argv, argv + argc); }

void InstallInterruptHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    // A rank waiting for the others in the rendezvous stops at the signal too (and deletes
    // its keys there), rather than waiting out its comm timeout.
    SetRendezvousInterruptCheck([] { return InterruptSignal(); });
  });
}

int InterruptSignal() { return g_signal.load(); }

int InterruptExitCode(int signal) { return 128 + signal; }

const char* InterruptName(int signal) { return signal == SIGTERM ? "SIGTERM" : "SIGINT"; }

std::string CommandLinePrefix(size_t drop_last) {
  std::string cmd;
  for (size_t i = 0; i + drop_last < g_argv.size(); ++i) {
    if (size_t drop = ArgsToDrop(i, {kSecretFlag}); drop != 0) {
      i += drop - 1;
      continue;
    }
    if (!cmd.empty()) cmd.push_back(' ');
    cmd.append(Quote(g_argv[i]));
  }
  return cmd;
}

bool CommandLineHasSecret() {
  if (EnvGet("STRATA_LAUNCH_COMMAND_HAD_SECRET") == "1") return true;
  for (size_t i = 0; i < g_argv.size(); ++i) {
    if (ArgsToDrop(i, {kSecretFlag}) != 0) return true;
  }
  return false;
}

std::string ResumeCommand(const std::string& resume_folder) {
  std::string cmd = EnvGet("STRATA_LAUNCH_COMMAND");
  for (size_t i = 0; i < g_argv.size(); ++i) {
    if (size_t drop = ArgsToDrop(i, {"--resume", kSecretFlag}); drop != 0) {
      i += drop - 1;  // --resume is appended below; a secret is never printed
      continue;
    }
    if (!cmd.empty()) cmd.push_back(' ');
    cmd.append(Quote(g_argv[i]));
  }
  cmd.append(" --resume ");
  cmd.append(Quote(resume_folder));
  return cmd;
}

std::string ResumeHint(const std::string& resume_folder) {
  const int64_t world = std::strtoll(EnvOr("WORLD_SIZE", "1").c_str(), nullptr, 10);
  const int64_t local = std::strtoll(EnvOr("LOCAL_WORLD_SIZE", "0").c_str(), nullptr, 10);
  std::string where;
  if (world > 1 && EnvGet("STRATA_LAUNCH_COMMAND").empty()) {
    where = ", on each of the " + std::to_string(world) +
            " ranks, started as this run was (torchrun, mpirun, srun)";
  } else if (world > 1 && local > 0 && local < world) {
    where = ", on each host, with that host's --node-rank";
  }
  std::string hint = "resume with" + where + ": " + ResumeCommand(resume_folder);
  if (CommandLineHasSecret()) {
    hint +=
        " (add the run secret again, best as --run-secret-file FILE or STRATA_RUN_SECRET: "
        "it is not printed)";
  }
  return hint;
}

}  // namespace strata::cli
