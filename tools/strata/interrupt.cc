// Interruption of a run; see interrupt.h.
#include "tools/strata/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

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
  });
}

int InterruptSignal() { return g_signal.load(); }

int InterruptExitCode(int signal) { return 128 + signal; }

const char* InterruptName(int signal) { return signal == SIGTERM ? "SIGTERM" : "SIGINT"; }

std::string ResumeCommand(const std::string& resume_folder) {
  std::string cmd;
  for (size_t i = 0; i < g_argv.size(); ++i) {
    const std::string& a = g_argv[i];
    if (a == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--resume=", 0) == 0) continue;
    if (!cmd.empty()) cmd.push_back(' ');
    cmd.append(Quote(a));
  }
  cmd.append(" --resume ");
  cmd.append(Quote(resume_folder));
  return cmd;
}

}  // namespace strata::cli
