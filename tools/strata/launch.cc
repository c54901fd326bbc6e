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
// are stopped with it, and dies with launch: a launch killed by SIGKILL (which it cannot pass
// on) leaves no rank running, since each rank gets SIGTERM when launch dies
// (PR_SET_PDEATHSIG), and stops as it would at a Ctrl-C.
//
// The run secret: every rank gets STRATA_RUN_SECRET, with which it signs its rendezvous keys
// and refuses keys that do not verify (comm/run_secret.h). It is --run-secret (or read from
// --run-secret-file), else STRATA_RUN_SECRET, else with one node a fresh random one; several
// nodes must share one,
// so there launch warns that the rendezvous is not authenticated when none is given.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
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

#include "comm/run_secret.h"
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
  std::string run_secret;       // "": STRATA_RUN_SECRET, else a fresh one (one node)
  std::string run_secret_file;  // --run-secret-file: the secret read from it
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

// SIGINT and SIGTERM reach OnSignal (launch passes them on to the ranks) while this lives;
// the handlers before it come back after. A forked rank restores them before it execs.
class SignalForwarding {
 public:
  SignalForwarding() {
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalForwarding() { RestoreHandlers(); }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;
  void RestoreHandlers() const {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

// What every rank's environment holds besides its own RANK and LOCAL_RANK.
struct RankEnvironment {
  std::string world, local_world, rendezvous;
  std::string launch_command;  // the launch's arguments up to the command (ResumeCommand)
  std::string run_secret;      // STRATA_RUN_SECRET ("" = unset)
  pid_t launcher = 0;          // this process, which the ranks die with
};

// The ranks of one launch, from their start until the last has exited: it owns their
// processes and output pipes, forwards their output, reaps them, names the failed rank that
// caused a failure, and escalates after one (the grace period, SIGTERM, then SIGKILL).
class Supervisor {
 public:
  explicit Supervisor(const LaunchArgs& args) : args_(args), ranks_(args.nproc) {}

  // Forks the ranks. False (printed) when a pipe or a fork fails; the ranks already started
  // are killed.
  bool Start(const RankEnvironment& env, const SignalForwarding& signals);
  // Until every rank has exited: forward output, reap ranks, escalate after a failure. Pipes
  // can outlive a rank (a grandchild holding them), so this ends on exits; Finish drains the
  // rest.
  void Supervise();
  // Drains what the ranks wrote last (bounded) and returns the launch's exit code, naming
  // the failed rank on stderr.
  int Finish();

 private:
  using Clock = std::chrono::steady_clock;
  // Not scheduled. Plain time points, not optionals: GCC 12 warns that a checked optional
  // time point may be used uninitialized.
  static constexpr Clock::time_point kNever = Clock::time_point::max();
  static constexpr auto kSettle = std::chrono::milliseconds(500);

  [[noreturn]] void ExecRank(int r, const RankEnvironment& env, const SignalForwarding& signals,
                             const std::vector<char*>& argv, int out_fd, int err_fd) const;
  void SignalAll(int sig) const;  // every running rank's process group
  // Waits up to 50 ms for output on the open streams (just sleeps when none is open) and
  // forwards what came; a stream that ended is closed.
  void ForwardOutput();
  void PassOnSignal();
  void Reap();
  void NameTheCause();
  void Escalate();

  const LaunchArgs& args_;
  std::vector<Rank> ranks_;
  std::vector<Stream> streams_;
  int running_ = 0;
  std::vector<int> failures_;         // failed ranks in the order they were reaped
  std::optional<int> first_failed_;   // the failed rank named as the cause
  std::optional<int> hung_reporter_;  // when first_failed_ hung: the failed rank that said so
  Clock::time_point decide_at_ = kNever, term_at_ = kNever, kill_at_ = kNever;
  bool passed_on_signal_ = false;
};

void Supervisor::ExecRank(int r, const RankEnvironment& env, const SignalForwarding& signals,
                          const std::vector<char*>& argv, int out_fd, int err_fd) const {
  ::setpgid(0, 0);
  signals.RestoreHandlers();
  // Die with the launcher. The parent may have died between fork and prctl: then this
  // process was already reparented, and getppid() tells.
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != env.launcher) ::_exit(128 + 15);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  ::setenv("RANK", std::to_string(args_.first_rank + r).c_str(), 1);
  ::setenv("WORLD_SIZE", env.world.c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", env.local_world.c_str(), 1);
  ::setenv("STRATA_RENDEZVOUS", env.rendezvous.c_str(), 1);
  ::setenv("STRATA_LAUNCH_COMMAND", env.launch_command.c_str(), 1);
  // The launch command above leaves a --run-secret out; the ranks' resume hint says so.
  if (CommandLineHasSecret()) ::setenv("STRATA_LAUNCH_COMMAND_HAD_SECRET", "1", 1);
  if (!env.run_secret.empty()) ::setenv("STRATA_RUN_SECRET", env.run_secret.c_str(), 1);
  if (!args_.comm_host.empty()) ::setenv("STRATA_COMM_HOST", args_.comm_host.c_str(), 1);
  if (!args_.comm_interface.empty()) {
    ::setenv("GLOO_SOCKET_IFNAME", args_.comm_interface.c_str(), 1);
  }
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "strata launch: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  std::fflush(stderr);
  ::_exit(127);
}

bool Supervisor::Start(const RankEnvironment& env, const SignalForwarding& signals) {
  std::vector<char*> argv;
  for (const std::string& a : args_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < args_.nproc; ++r) {
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "strata launch: pipe: %s\n", std::strerror(errno));
      SignalAll(SIGKILL);
      return false;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "strata launch: fork for rank %d: %s\n", r, std::strerror(errno));
      SignalAll(SIGKILL);
      return false;
    }
    if (pid == 0) ExecRank(r, env, signals, argv, out_pipe[1], err_pipe[1]);
    ::setpgid(pid, pid);  // also here, so that it holds before the first kill
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    ranks_[r].pid = pid;
    ranks_[r].running = true;
    ++running_;
    streams_.push_back(Stream{out_pipe[0], r, true, {}});
    streams_.push_back(Stream{err_pipe[0], r, false, {}});
  }
  return true;
}

void Supervisor::SignalAll(int sig) const {
  for (const Rank& r : ranks_) {
    if (r.running) ::kill(-r.pid, sig);
  }
}

void Supervisor::ForwardOutput() {
  std::vector<pollfd> fds;
  std::vector<Stream*> polled;
  for (Stream& s : streams_) {
    if (s.fd >= 0) {
      fds.push_back(pollfd{s.fd, POLLIN, 0});
      polled.push_back(&s);
    }
  }
  if (::poll(fds.data(), fds.size(), 50) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !Pump(args_, *polled[i])) {
      ::close(polled[i]->fd);
      polled[i]->fd = -1;
    }
  }
}

// A signal to launch goes on to every rank, once; SIGKILL follows 5 s later.
void Supervisor::PassOnSignal() {
  if (g_signal == 0 || passed_on_signal_) return;
  passed_on_signal_ = true;
  std::fprintf(stderr, "strata launch: got signal %d; stopping the ranks\n",
               static_cast<int>(g_signal));
  SignalAll(SIGTERM);
  kill_at_ = Clock::now() + std::chrono::seconds(5);
}

// Reaps every rank that has exited. The first failure starts the grace period and, a moment
// later (kSettle), NameTheCause.
void Supervisor::Reap() {
  for (;;) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    for (int r = 0; r < args_.nproc; ++r) {
      Rank& rank = ranks_[r];
      if (rank.pid != pid || !rank.running) continue;
      rank.running = false;
      --running_;
      if (WIFSIGNALED(st)) {
        rank.killed_by_signal = true;
        rank.signal = WTERMSIG(st);
        rank.exit_code = 128 + WTERMSIG(st);
      } else {
        rank.exit_code = WEXITSTATUS(st);
      }
      if (rank.exit_code == 0 || passed_on_signal_) continue;
      std::fprintf(stderr, "strata launch: rank %d %s\n", args_.first_rank + r,
                   Describe(rank).c_str());
      if (failures_.empty()) {
        decide_at_ = Clock::now() + kSettle;
        if (running_ > 0) {
          std::fprintf(stderr, "strata launch: giving the other ranks %.3g s to stop\n",
                       args_.grace_s);
          term_at_ = Clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(args_.grace_s * 1000.0));
        }
      }
      failures_.push_back(r);
    }
  }
}

// Which failed rank is named as the cause: a rank killed by a signal before ranks that
// exited non-zero, in exit order (a dead rank's peers exit with comm errors moments after
// it, and the kernel may report them first); but a rank that the failed ones say sent
// nothing, and that has not failed itself, hung: the others only gave up waiting for it.
void Supervisor::NameTheCause() {
  if (first_failed_ || failures_.empty() || (Clock::now() < decide_at_ && running_ > 0)) return;
  std::vector<int> order = failures_;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return ranks_[a].killed_by_signal && !ranks_[b].killed_by_signal;
  });
  first_failed_ = order.front();
  for (const Stream& s : streams_) {
    const int h = s.named_hung < 0 ? -1 : s.named_hung - args_.first_rank;
    if (h >= 0 && h < args_.nproc && ranks_[h].running &&
        std::find(failures_.begin(), failures_.end(), s.rank) != failures_.end()) {
      first_failed_ = h;
      hung_reporter_ = s.rank;
      return;
    }
  }
}

void Supervisor::Escalate() {
  const auto now = Clock::now();
  if (now >= term_at_ && running_ > 0) {
    term_at_ = kNever;
    std::fprintf(stderr, "strata launch: grace period over; sending SIGTERM to %d rank(s)\n",
                 running_);
    SignalAll(SIGTERM);
    kill_at_ = now + std::chrono::seconds(5);
  }
  if (now >= kill_at_ && running_ > 0) {
    kill_at_ = kNever;
    std::fprintf(stderr, "strata launch: sending SIGKILL to %d rank(s)\n", running_);
    SignalAll(SIGKILL);
  }
}

void Supervisor::Supervise() {
  while (running_ > 0) {
    ForwardOutput();
    PassOnSignal();
    Reap();
    NameTheCause();
    Escalate();
  }
}

int Supervisor::Finish() {
  // Bounded: a leftover grandchild may keep a pipe open.
  const auto drain_end = Clock::now() + std::chrono::seconds(2);
  auto any_open = [&] {
    return std::any_of(streams_.begin(), streams_.end(), [](const Stream& s) { return s.fd >= 0; });
  };
  while (any_open() && Clock::now() < drain_end) ForwardOutput();
  for (Stream& s : streams_) {
    if (s.fd >= 0) {
      if (!s.partial.empty()) Emit(args_, s, s.partial + "\n");
      ::close(s.fd);
    }
  }
  if (first_failed_ && hung_reporter_) {
    const Rank& r = ranks_[*first_failed_];
    std::fprintf(stderr,
                 "strata launch: failed: rank %d of %d hung: rank %d got nothing from it within "
                 "its comm timeout, and it did not stop by itself (it %s)\n",
                 args_.first_rank + *first_failed_, args_.world, args_.first_rank + *hung_reporter_,
                 Describe(r).c_str());
    return r.exit_code != 0 ? r.exit_code : 1;
  }
  if (first_failed_) {
    const Rank& r = ranks_[*first_failed_];
    std::fprintf(stderr, "strata launch: failed: rank %d of %d %s\n",
                 args_.first_rank + *first_failed_, args_.world, Describe(r).c_str());
    return r.exit_code;
  }
  if (passed_on_signal_) return 128 + static_cast<int>(g_signal);
  for (int r = 0; r < args_.nproc; ++r) {
    if (ranks_[r].exit_code != 0) {
      std::fprintf(stderr, "strata launch: failed: rank %d of %d %s\n", args_.first_rank + r,
                   args_.world, Describe(ranks_[r]).c_str());
      return ranks_[r].exit_code;
    }
  }
  return 0;
}

// The flags that can be checked before anything starts; prints what is wrong.
bool CheckLaunchArgs(const LaunchArgs& args) {
  if (args.nproc < 1 || args.nproc > kMaxLocalRanks) {
    std::fprintf(stderr,
                 "strata launch: -n %d: the number of ranks on this host must be at least 1 and "
                 "at most %d\n",
                 args.nproc, kMaxLocalRanks);
    return false;
  }
  if (!RoomForPipes(args.nproc)) return false;
  if (args.command.empty()) {
    std::fprintf(stderr,
                 "strata launch: no command given; usage: strata launch -n N -- COMMAND...\n");
    return false;
  }
  if (args.output != "prefix" && args.output != "rank0") {
    std::fprintf(stderr, "strata launch: --output %s: expected prefix or rank0\n",
                 args.output.c_str());
    return false;
  }
  return true;
}

int RunLaunch(LaunchArgs& args) {
  if (!CheckLaunchArgs(args) || !ResolveNodes(args)) return 2;
  Result<std::string> given_secret = RunSecretFromFlags(args.run_secret, args.run_secret_file);
  if (!given_secret.ok()) {
    std::fprintf(stderr, "strata launch: %s\n", given_secret.status().ToString().c_str());
    return 2;
  }
  std::string tmp_root = "/tmp";
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') tmp_root = t;
  // Removed when RunLaunch returns, however it returns (the ranks have exited by then, or
  // were never started).
  TempFolder rdzv;
  RankEnvironment env{std::to_string(args.world), std::to_string(args.nproc), args.rendezvous,
                      // An interrupted run's resume command starts with these.
                      CommandLinePrefix(args.command.size()), *given_secret, ::getpid()};
  if (const char* e = std::getenv("STRATA_RUN_SECRET"); env.run_secret.empty() && e != nullptr) {
    env.run_secret = e;
  }
  if (env.run_secret.empty() && args.nnodes == 1) {
    Result<std::string> secret = NewRunSecret();
    if (!secret.ok()) {
      std::fprintf(stderr, "strata launch: %s\n", secret.status().ToString().c_str());
      return 1;
    }
    env.run_secret = *secret;
  } else if (env.run_secret.empty()) {
    std::fprintf(stderr,
                 "strata launch: warning: --nnodes %d without a run secret: any process that "
                 "reaches the rendezvous can join the run; give every host's launch the same "
                 "STRATA_RUN_SECRET or --run-secret-file (e.g. from openssl rand -hex 32; "
                 "--run-secret shows it in ps)\n",
                 args.nnodes);
  }
  if (env.rendezvous.empty()) {
    if (Result<std::string> made = rdzv.Make(tmp_root + "/strata-launch-"); !made.ok()) {
      std::fprintf(stderr, "strata launch: cannot create a rendezvous folder under %s: %s\n",
                   tmp_root.c_str(), std::strerror(made.status().err_no()));
      return 1;
    }
    env.rendezvous = "file:" + rdzv.path();
  }
  const SignalForwarding signals;
  Supervisor ranks(args);
  if (!ranks.Start(env, signals)) return 1;
  ranks.Supervise();
  return ranks.Finish();
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
  sub->add_option("--run-secret", args->run_secret,
                  "The run's secret (sets STRATA_RUN_SECRET): every rank signs its rendezvous "
                  "keys with it and ignores keys that do not verify. Default: "
                  "STRATA_RUN_SECRET, else a fresh random one with one node (several nodes "
                  "must share one: set STRATA_RUN_SECRET on each, or --run-secret-file, which "
                  "stay out of ps)");
  sub->add_option("--run-secret-file", args->run_secret_file,
                  "The run's secret, read from this file (readable by its owner alone: chmod "
                  "600): as --run-secret, but out of ps; the ranks get it as STRATA_RUN_SECRET");
  sub->add_option("--grace", args->grace_s,
                  "Seconds the other ranks get to stop by themselves after one fails, before "
                  "SIGTERM (then SIGKILL 5 s later)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("command", args->command, "The command each rank runs, after --")->required();
  sub->callback([args, exit_code] { *exit_code = RunLaunch(*args); });
}

}  // namespace strata::cli
