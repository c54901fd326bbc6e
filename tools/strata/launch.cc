// `strata launch -n N -- COMMAND...`: starts N local ranks of COMMAND that meet through a
// fresh temporary FileStore, the way torchrun does for one host; with --nnodes M and
// --node-rank K (or Slurm's SLURM_NNODES and SLURM_NODEID, one launch per node), this host's
// N ranks of an M-host run, ranks K*N .. K*N+N-1, meeting through --rendezvous (a Redis
// server or a shared folder every host reaches).
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and STRATA_RENDEZVOUS (and
// STRATA_COMM_HOST / GLOO_SOCKET_IFNAME from --comm-host / --comm-interface). Output: with
// --output prefix (the default) every line a rank writes to
// stdout or stderr is forwarded to the same stream prefixed "[rank r] "; with --output rank0
// rank 0's stdout is forwarded unchanged (clean --json output) and the other ranks' stdout
// is dropped, while every rank's stderr stays prefixed. When a rank exits non-zero (or is
// killed), the others get --grace seconds to notice and exit by themselves (with comm
// errors naming the lost rank), then SIGTERM, then SIGKILL 5 s later. The exit code is 0
// when every rank succeeded, else the first failed rank's code (128+signal if killed), and
// the last line on stderr names that rank; but when the failed ranks' errors say a rank that
// has not failed "sent nothing" (it hangs), that rank is named as the cause. SIGINT/SIGTERM to
// launch are passed on to the ranks. Each rank runs in its own process group so that its children
// are stopped with it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/interrupt.h"

namespace strata::cli {
namespace {

// Bounds on -n and --nnodes: each local rank is a process with two pipes here, and a typo
// (-n 100000) would fork until the host's process table is full.
constexpr int kMaxLocalRanks = 1024;
constexpr int kMaxNodes = 65536;  // with kMaxLocalRanks, WORLD_SIZE still fits an int

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

struct LaunchArgs {
  int nproc = 0;
  int nnodes = 0;              // 0: SLURM_NNODES under Slurm, else 1
  int node_rank = -1;          // -1: SLURM_NODEID under Slurm, else 0 with one node
  std::string rendezvous;      // "": several nodes STRATA_RENDEZVOUS, one a temporary folder
  std::string comm_host;       // STRATA_COMM_HOST for the ranks
  std::string comm_interface;  // GLOO_SOCKET_IFNAME for the ranks
  std::string output = "prefix";
  double grace_s = 10.0;
  std::vector<std::string> command;
  // Resolved by ResolveNodes: this host's first global rank and the world size.
  int first_rank = 0;
  int world = 0;
};

// One output stream of one rank: a pipe whose bytes are cut into lines.
struct Stream {
  int fd = -1;
  int rank = 0;
  bool is_stdout = true;
  std::string partial;  // bytes after the last newline
  int named_hung = -1;  // stderr: the rank this one said sent nothing (hung), if any
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;  // 128+signal when killed
  bool killed_by_signal = false;
  int signal = 0;
};

void WriteAll(FILE* out, const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), out);
  std::fflush(out);
}

void Emit(const LaunchArgs& args, const Stream& s, const std::string& line) {
  if (args.output == "rank0" && s.is_stdout) {
    if (args.first_rank + s.rank == 0) WriteAll(stdout, line);
    return;
  }
  WriteAll(s.is_stdout ? stdout : stderr,
           "[rank " + std::to_string(args.first_rank + s.rank) + "] " + line);
}

// The rank a failing rank's error names as hung ("rank 3 sent nothing for 5 s", the
// communicator's words for a peer that is alive but silent), or -1.
int NamedHungRank(const std::string& line) {
  const size_t at = line.find(" sent nothing for ");
  if (at == std::string::npos) return -1;
  size_t digits = at;
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(line[digits - 1]))) --digits;
  if (digits == at || digits < 5 || line.compare(digits - 5, 5, "rank ") != 0) return -1;
  return std::atoi(line.c_str() + digits);
}

// Reads what is available; forwards complete lines. Returns false at EOF or on error.
bool Pump(const LaunchArgs& args, Stream& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!s.partial.empty()) Emit(args, s, s.partial + "\n");
    s.partial.clear();
    return false;
  }
  s.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl = s.partial.find('\n'); nl != std::string::npos;
       nl = s.partial.find('\n', start)) {
    const std::string line = s.partial.substr(start, nl - start + 1);
    if (!s.is_stdout && s.named_hung < 0) s.named_hung = NamedHungRank(line);
    Emit(args, s, line);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  return true;
}

std::string Describe(const Rank& r) {
  return r.killed_by_signal
             ? "was killed by signal " + std::to_string(r.signal) + " (" + strsignal(r.signal) + ")"
             : "exited with code " + std::to_string(r.exit_code);
}

std::optional<int> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<int>(n);
}

// The nodes of the run: --nnodes and --node-rank, else Slurm's SLURM_NNODES and
// SLURM_NODEID when launch is one Slurm task per node, else one node; and the rendezvous
// several nodes must share. Prints the error and returns false when they do not add up.
bool ResolveNodes(LaunchArgs& args) {
  const bool slurm =
      std::getenv("SLURM_PROCID") != nullptr && EnvInt("SLURM_NNODES") && EnvInt("SLURM_NODEID");
  if (args.nnodes == 0 && slurm) {
    const int tasks = EnvInt("SLURM_NTASKS").value_or(*EnvInt("SLURM_NNODES"));
    if (tasks != *EnvInt("SLURM_NNODES")) {
      std::fprintf(stderr,
                   "strata launch: under Slurm with SLURM_NTASKS=%d on SLURM_NNODES=%d nodes: "
                   "start one launch per node (srun --ntasks-per-node 1 strata launch -n N "
                   "...), or start strata itself under srun without launch\n",
                   tasks, *EnvInt("SLURM_NNODES"));
      return false;
    }
    args.nnodes = *EnvInt("SLURM_NNODES");
    if (args.node_rank < 0) args.node_rank = *EnvInt("SLURM_NODEID");
  }
  if (args.nnodes == 0) args.nnodes = 1;
  if (args.nnodes < 1 || args.nnodes > kMaxNodes) {
    std::fprintf(stderr, "strata launch: --nnodes %d: expected at least 1 and at most %d\n",
                 args.nnodes, kMaxNodes);
    return false;
  }
  if (args.node_rank < 0) {
    if (args.nnodes > 1) {
      std::fprintf(stderr,
                   "strata launch: --nnodes %d needs --node-rank K (0..%d), this host's index "
                   "(or run under Slurm, which gives SLURM_NODEID)\n",
                   args.nnodes, args.nnodes - 1);
      return false;
    }
    args.node_rank = 0;
  }
  if (args.node_rank >= args.nnodes) {
    std::fprintf(stderr, "strata launch: --node-rank %d is outside [0, --nnodes %d)\n",
                 args.node_rank, args.nnodes);
    return false;
  }
  // One node without --rendezvous meets in a fresh folder, whatever the environment says
  // (a STRATA_RENDEZVOUS meant for another run would be stale).
  if (args.rendezvous.empty() && args.nnodes > 1) {
    if (const char* env = std::getenv("STRATA_RENDEZVOUS")) args.rendezvous = env;
  }
  if (args.nnodes > 1 && args.rendezvous.empty()) {
    std::fprintf(stderr,
                 "strata launch: --nnodes %d: the hosts need a rendezvous they all reach: "
                 "--rendezvous redis://HOST:PORT/PREFIX or file:DIR on a shared file system "
                 "(or STRATA_RENDEZVOUS)\n",
                 args.nnodes);
    return false;
  }
  args.first_rank = args.node_rank * args.nproc;
  args.world = args.nnodes * args.nproc;
  return true;
}

// Whether this process may hold the read ends of the two pipes of each of `nproc` ranks
// (raising its soft limit on open files when the hard one allows); prints why not. Checked
// before the first fork: a pipe that failed midway would leave the ranks already started
// waiting for peers that never come.
bool RoomForPipes(int nproc) {
  const rlim_t need = 2 * static_cast<rlim_t>(nproc) + 64;  // and a margin for the rest
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= need) return true;
  if (lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= need) {
    lim.rlim_cur = need;
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) return true;
  }
  std::fprintf(stderr,
               "strata launch: -n %d needs %llu open files for the ranks' output pipes, more "
               "than this host allows (ulimit -n: %llu); start fewer ranks or raise the limit\n",
               nproc, static_cast<unsigned long long>(need),
               static_cast<unsigned long long>(lim.rlim_max));
  return false;
}

int RunLaunch(LaunchArgs& args) {
  if (args.nproc < 1 || args.nproc > kMaxLocalRanks) {
    std::fprintf(stderr,
                 "strata launch: -n %d: the number of ranks on this host must be at least 1 and "
                 "at most %d\n",
                 args.nproc, kMaxLocalRanks);
    return 2;
  }
  if (!RoomForPipes(args.nproc)) return 2;
  if (args.command.empty()) {
    std::fprintf(stderr,
                 "strata launch: no command given; usage: strata launch -n N -- COMMAND...\n");
    return 2;
  }
  if (args.output != "prefix" && args.output != "rank0") {
    std::fprintf(stderr, "strata launch: --output %s: expected prefix or rank0\n",
                 args.output.c_str());
    return 2;
  }

  if (!ResolveNodes(args)) return 2;
  std::string tmp_root = "/tmp";
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') tmp_root = t;
  // Removed when RunLaunch returns, however it returns (the ranks have exited by then, or
  // were never started).
  TempFolder rdzv;
  std::string rendezvous = args.rendezvous;
  if (rendezvous.empty()) {
    if (Result<std::string> made = rdzv.Make(tmp_root + "/strata-launch-"); !made.ok()) {
      std::fprintf(stderr, "strata launch: cannot create a rendezvous folder under %s: %s\n",
                   tmp_root.c_str(), std::strerror(made.status().err_no()));
      return 1;
    }
    rendezvous = "file:" + rdzv.path();
  }
  const std::string world = std::to_string(args.world);
  const std::string local_world = std::to_string(args.nproc);
  // The launch's own arguments, up to the command: an interrupted run's resume command
  // starts with them (ResumeCommand).
  const std::string launch_command = CommandLinePrefix(args.command.size());

  std::vector<char*> argv;
  for (const std::string& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int = {}, old_term = {};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  std::vector<Rank> ranks(args.nproc);
  std::vector<Stream> streams;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < args.nproc; ++r) {
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "strata launch: pipe: %s\n", std::strerror(errno));
      return 1;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "strata launch: fork for rank %d: %s\n", r, std::strerror(errno));
      for (int k = 0; k < r; ++k) ::kill(-ranks[k].pid, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::sigaction(SIGINT, &old_int, nullptr);
      ::sigaction(SIGTERM, &old_term, nullptr);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      ::setenv("RANK", std::to_string(args.first_rank + r).c_str(), 1);
      ::setenv("WORLD_SIZE", world.c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", local_world.c_str(), 1);
      ::setenv("STRATA_RENDEZVOUS", rendezvous.c_str(), 1);
      ::setenv("STRATA_LAUNCH_COMMAND", launch_command.c_str(), 1);
      if (!args.comm_host.empty()) ::setenv("STRATA_COMM_HOST", args.comm_host.c_str(), 1);
      if (!args.comm_interface.empty()) {
        ::setenv("GLOO_SOCKET_IFNAME", args.comm_interface.c_str(), 1);
      }
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "strata launch: cannot run '%s': %s\n", argv[0], std::strerror(errno));
      std::fflush(stderr);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so that it holds before the first kill
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    ranks[r].pid = pid;
    ranks[r].running = true;
    streams.push_back(Stream{out_pipe[0], r, true, {}});
    streams.push_back(Stream{err_pipe[0], r, false, {}});
  }

  using Clock = std::chrono::steady_clock;
  std::optional<int> first_failed;   // the failed rank named as the cause
  std::vector<int> failures;         // failed ranks in the order they were reaped
  std::optional<int> hung_reporter;  // when first_failed hung: the failed rank that said so
  std::optional<Clock::time_point> decide_at;
  constexpr auto kSettle = std::chrono::milliseconds(500);
  // When to escalate (kNever: not scheduled). Plain time points, not optionals: GCC 12 warns
  // that a checked optional time point may be used uninitialized.
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point term_at = kNever, kill_at = kNever;
  bool forwarded_signal = false;
  int running = args.nproc;
  auto signal_all = [&](int sig) {
    for (const Rank& r : ranks) {
      if (r.running) ::kill(-r.pid, sig);
    }
  };

  // Waits up to 50 ms for output on the open streams (just sleeps when none is open) and
  // forwards what came; a stream that ended is closed.
  auto forward_output = [&] {
    std::vector<pollfd> fds;
    std::vector<Stream*> polled;
    for (Stream& s : streams) {
      if (s.fd >= 0) {
        fds.push_back(pollfd{s.fd, POLLIN, 0});
        polled.push_back(&s);
      }
    }
    if (::poll(fds.data(), fds.size(), 50) <= 0) return;
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !Pump(args, *polled[i])) {
        ::close(polled[i]->fd);
        polled[i]->fd = -1;
      }
    }
  };

  // Until every rank has exited: forward output, reap ranks, escalate after a failure.
  // Pipes can outlive a rank (a grandchild holding them), so the loop ends on exits, and
  // the remaining output is drained afterwards with a bound.
  while (running > 0) {
    forward_output();
    if (g_signal != 0 && !forwarded_signal) {
      forwarded_signal = true;
      std::fprintf(stderr, "strata launch: got signal %d; stopping the ranks\n",
                   static_cast<int>(g_signal));
      signal_all(SIGTERM);
      kill_at = Clock::now() + std::chrono::seconds(5);
    }
    // Reap every rank that has exited. The first failure starts the grace period; which
    // failed rank is named as the cause is decided a moment later (kSettle), preferring a
    // rank killed by a signal over ranks that exited non-zero, in exit order: a dead rank's
    // peers exit with comm errors moments after it, and the kernel may report them first.
    for (;;) {
      int st = 0;
      pid_t pid = ::waitpid(-1, &st, WNOHANG);
      if (pid <= 0) break;
      for (int r = 0; r < args.nproc; ++r) {
        if (ranks[r].pid != pid || !ranks[r].running) continue;
        ranks[r].running = false;
        --running;
        if (WIFSIGNALED(st)) {
          ranks[r].killed_by_signal = true;
          ranks[r].signal = WTERMSIG(st);
          ranks[r].exit_code = 128 + WTERMSIG(st);
        } else {
          ranks[r].exit_code = WEXITSTATUS(st);
        }
        if (ranks[r].exit_code == 0 || forwarded_signal) continue;
        std::fprintf(stderr, "strata launch: rank %d %s\n", args.first_rank + r,
                     Describe(ranks[r]).c_str());
        if (failures.empty()) {
          decide_at = Clock::now() + kSettle;
          if (running > 0) {
            std::fprintf(stderr, "strata launch: giving the other ranks %.3g s to stop\n",
                         args.grace_s);
            term_at = Clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(args.grace_s * 1000.0));
          }
        }
        failures.push_back(r);
      }
    }
    if (!first_failed && !failures.empty() && (Clock::now() >= *decide_at || running == 0)) {
      std::vector<int> order = failures;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return ranks[a].killed_by_signal && !ranks[b].killed_by_signal;
      });
      first_failed = order.front();
      // A rank that the failed ones say sent nothing, and that has not failed itself, hung:
      // the others only gave up waiting for it.
      for (const Stream& s : streams) {
        const int h = s.named_hung < 0 ? -1 : s.named_hung - args.first_rank;
        if (h >= 0 && h < args.nproc && ranks[h].running &&
            std::find(failures.begin(), failures.end(), s.rank) != failures.end()) {
          first_failed = h;
          hung_reporter = s.rank;
          break;
        }
      }
    }
    auto now = Clock::now();
    if (now >= term_at && running > 0) {
      term_at = kNever;
      std::fprintf(stderr, "strata launch: grace period over; sending SIGTERM to %d rank(s)\n",
                   running);
      signal_all(SIGTERM);
      kill_at = now + std::chrono::seconds(5);
    }
    if (now >= kill_at && running > 0) {
      kill_at = kNever;
      std::fprintf(stderr, "strata launch: sending SIGKILL to %d rank(s)\n", running);
      signal_all(SIGKILL);
    }
  }

  // Drain what the ranks wrote last (bounded: a leftover grandchild may keep a pipe open).
  auto drain_end = Clock::now() + std::chrono::seconds(2);
  auto any_open = [&] {
    return std::any_of(streams.begin(), streams.end(), [](const Stream& s) { return s.fd >= 0; });
  };
  while (any_open() && Clock::now() < drain_end) forward_output();
  for (Stream& s : streams) {
    if (s.fd >= 0) {
      if (!s.partial.empty()) Emit(args, s, s.partial + "\n");
      ::close(s.fd);
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (first_failed && hung_reporter) {
    const Rank& r = ranks[*first_failed];
    std::fprintf(stderr,
                 "strata launch: failed: rank %d of %d hung: rank %d got nothing from it within "
                 "its comm timeout, and it did not stop by itself (it %s)\n",
                 args.first_rank + *first_failed, args.world, args.first_rank + *hung_reporter,
                 Describe(r).c_str());
    return r.exit_code != 0 ? r.exit_code : 1;
  }
  if (first_failed) {
    const Rank& r = ranks[*first_failed];
    std::fprintf(stderr, "strata launch: failed: rank %d of %d %s\n",
                 args.first_rank + *first_failed, args.world, Describe(r).c_str());
    return r.exit_code;
  }
  if (forwarded_signal) return 128 + static_cast<int>(g_signal);
  for (int r = 0; r < args.nproc; ++r) {
    if (ranks[r].exit_code != 0) {
      std::fprintf(stderr, "strata launch: failed: rank %d of %d %s\n", args.first_rank + r,
                   args.world, Describe(ranks[r]).c_str());
      return ranks[r].exit_code;
    }
  }
  return 0;
}

}  // namespace

void AddLaunch(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start N local ranks of a command that meet through a temporary rendezvous folder, or\n"
      "with --nnodes, this host's N ranks of a run across hosts that meet through\n"
      "--rendezvous. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and\n"
      "STRATA_RENDEZVOUS. Under Slurm (one launch per node) --nnodes and --node-rank default\n"
      "to SLURM_NNODES and SLURM_NODEID.\n"
      "Example: strata launch -n 2 -- strata train ...   (multi-node: docs/multirank.md)");
  sub->add_option("-n,--nproc", args->nproc, "Number of ranks to start on this host (>= 1)")
      ->required();
  sub->add_option("--nnodes", args->nnodes,
                  "Hosts in the run, each running one launch (default: SLURM_NNODES under "
                  "Slurm, else 1); WORLD_SIZE = nnodes x nproc");
  sub->add_option("--node-rank", args->node_rank,
                  "This host's index in 0..nnodes-1 (default: SLURM_NODEID under Slurm; "
                  "required with --nnodes > 1 otherwise); RANK = node-rank x nproc + LOCAL_RANK");
  sub->add_option("--rendezvous", args->rendezvous,
                  "Where the ranks of all hosts meet: redis://HOST:PORT/PREFIX or file:DIR on a "
                  "shared file system (default: STRATA_RENDEZVOUS; with one node and neither, "
                  "a temporary folder)");
  sub->add_option("--comm-host", args->comm_host,
                  "Address the ranks' Gloo transport listens on (sets STRATA_COMM_HOST): this "
                  "host's address on the network the hosts share");
  sub->add_option("--comm-interface", args->comm_interface,
                  "Network interface whose address Gloo listens on (sets GLOO_SOCKET_IFNAME; "
                  "--comm-host wins)");
  sub->add_option("--output", args->output,
                  "prefix: every rank's stdout/stderr lines prefixed with [rank r]; rank0: "
                  "rank 0's stdout unchanged, other ranks' stdout dropped, stderr prefixed "
                  "(so that `--json -` output stays one parseable document)")
      ->capture_default_str();
  sub->add_option("--grace", args->grace_s,
                  "Seconds the other ranks get to stop by themselves after one fails, before "
                  "SIGTERM (then SIGKILL 5 s later)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("command", args->command, "The command each rank runs, after --")->required();
  sub->callback([args, exit_code] { *exit_code = RunLaunch(*args); });
}

}  // namespace strata::cli
