// Peer-loss forensics of the Gloo backend; see gloo_forensics.h.
#include "comm/gloo_forensics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "comm/gloo_store.h"

namespace strata::gloo_internal {

using namespace std::chrono_literals;

std::optional<int> FindRankInMessage(std::string_view message,
                                     const std::vector<std::vector<std::string>>& endpoints) {
  for (size_t r = 0; r < endpoints.size(); ++r) {
    for (const std::string& addr : endpoints[r]) {
      if (addr.empty()) continue;
      for (size_t pos = message.find(addr); pos != std::string_view::npos;
           pos = message.find(addr, pos + 1)) {
        size_t after = pos + addr.size();
        if (after < message.size() && message[after] >= '0' && message[after] <= '9') continue;
        return static_cast<int>(r);
      }
    }
  }
  return std::nullopt;
}

std::vector<std::string> LocalTcpEndpoints(int* established) {
  if (established != nullptr) *established = 0;
  // Socket inodes this process holds.
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code ec2;
    std::string target = std::filesystem::read_symlink(entry.path(), ec2).string();
    if (!ec2 && target.starts_with("socket:[") && target.ends_with("]")) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    const bool v6 = std::string_view(table).ends_with("6");
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      if (!(in >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >>
            inode)) {
        continue;
      }
      if (!inodes.count(inode)) continue;
      if (established != nullptr && st == "01") ++*established;
      size_t colon = local.find(':');
      if (colon == std::string::npos) continue;
      std::string hex = local.substr(0, colon);
      unsigned port = std::stoul(local.substr(colon + 1), nullptr, 16);
      char text[INET6_ADDRSTRLEN] = {};
      // The kernel prints the address as 32-bit words in host byte order.
      if (!v6 && hex.size() == 8) {
        in_addr a;
        a.s_addr = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
        ::inet_ntop(AF_INET, &a, text, sizeof(text));
      } else if (v6 && hex.size() == 32) {
        in6_addr a;
        for (int w = 0; w < 4; ++w) {
          uint32_t word = static_cast<uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
          std::memcpy(reinterpret_cast<char*>(&a) + w * 4, &word, 4);
        }
        ::inet_ntop(AF_INET6, &a, text, sizeof(text));
      } else {
        continue;
      }
      auto endpoint = [&](unsigned p) {
        return std::string("[").append(text).append("]:").append(std::to_string(p));
      };
      out.push_back(endpoint(port));
      // Gloo's Address::str() prints sin_port without ntohs(): list that form as well.
      unsigned swapped = ((port & 0xff) << 8) | (port >> 8);
      if (swapped != port) out.push_back(endpoint(swapped));
    }
  }
  return out;
}

namespace {

// A /proc/<pid>/stat file, read with read(2): nullopt when it cannot be opened or read (the
// process is gone; reading a stat file whose process exits meanwhile fails with ESRCH, which
// libstdc++'s filebuf would throw through an istreambuf_iterator).
std::optional<std::string> ReadStat(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

std::string ProcessIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string stat = ReadStat("/proc/self/stat").value_or("");
  return std::string(host) + " " + std::to_string(::getpid()) + " " + StartTimeFromStat(stat);
}

std::string StartTimeFromStat(const std::string& stat) {
  // Fields after the command name (which may contain spaces) start at ") ": state is field
  // 3, starttime field 22 of proc(5).
  size_t close = stat.rfind(") ");
  if (close == std::string::npos) return "";
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
}

bool ProcessIsGone(const std::string& identity) {
  std::istringstream in(identity);
  std::string host, pid_s, start;
  if (!(in >> host >> pid_s >> start)) return false;
  char me[256] = {};
  ::gethostname(me, sizeof(me) - 1);
  if (host != me) return false;  // another host: cannot tell from here
  const std::optional<std::string> read = ReadStat("/proc/" + pid_s + "/stat");
  if (!read) return true;  // no such process (or it exited while being read)
  const std::string& stat = *read;
  if (StartTimeFromStat(stat) != start) return true;  // the pid was reused
  size_t close = stat.rfind(") ");
  char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
  return state == 'Z' || state == 'X';  // exited, not yet reaped
}

// Gloo's tcp Address::str() reads "[127.0.0.1]:897" (a pair's address may append "$seq");
// the peer named in error messages uses the same form, so matching uses it as is.
std::string ListenAddressFromPairAddress(std::string s) {
  size_t dollar = s.find('$');
  if (dollar != std::string::npos) s.resize(dollar);
  return s;
}

// "[127.0.0.1]:897" -> "127.0.0.1": the host is what helps a user find the lost rank (the
// port Gloo prints is in network byte order, so it would only mislead).
std::string ReadableHost(const std::string& s) {
  size_t open = s.find('[');
  size_t close = s.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return s;
  return s.substr(open + 1, close - open - 1);
}

// Drops Gloo's "[/path/to/file.cc:123] " source prefixes, which mean nothing to users.
std::string CleanGlooMessage(std::string_view what) {
  std::string out;
  size_t i = 0;
  while (i < what.size()) {
    if (what[i] == '[') {
      size_t close = what.find(']', i);
      if (close != std::string_view::npos) {
        std::string_view inside = what.substr(i + 1, close - i - 1);
        if (inside.find(".cc:") != std::string_view::npos ||
            inside.find(".h:") != std::string_view::npos) {
          i = close + 1;
          while (i < what.size() && what[i] == ' ') ++i;
          continue;
        }
      }
    }
    out.push_back(what[i++]);
  }
  return out;
}

namespace {
// "5 s", "2.5 s", "0.25 s".
std::string Seconds(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}
}  // namespace

bool LooksLikeTimeout(std::string_view msg) {
  return msg.find("imed out") != std::string_view::npos ||
         msg.find("imeout") != std::string_view::npos;
}

PeerLossForensics::PeerLossForensics(int rank, int world_size, std::chrono::milliseconds timeout,
                                     std::shared_ptr<GlooKeyValueStore> kv,
                                     std::vector<std::string> addresses,
                                     std::vector<std::vector<std::string>> endpoints,
                                     std::vector<std::string> identities)
    : rank_(rank),
      world_(world_size),
      timeout_(timeout),
      kv_(std::move(kv)),
      addresses_(std::move(addresses)),
      endpoints_(std::move(endpoints)),
      identities_(std::move(identities)) {}

Status PeerLossForensics::Failure(const char* op_name, const std::string& what) {
  std::string msg = CleanGlooMessage(what);
  bool timeout = LooksLikeTimeout(msg);
  // Reports already in the store come first: once the ranks next to a dead one give up,
  // their own exits look like failures to the rest ("connection reset by rank 3"), so a
  // rank's own reading of its message can blame a survivor; the first reports cannot.
  int reporter = -1;
  // A rank on this host whose process is gone is the surest answer; then what other
  // ranks reported; then the peer this rank's own message names.
  std::optional<int> lost = DeadLocalRank();
  if (!lost) lost = ReportedLostRank(&reporter);
  if (!lost) {
    // A peer that has itself reported a failure is alive and gave up: its closing the
    // connection is a consequence, not the cause.
    std::optional<int> named = FindRankInMessage(what, endpoints_);
    if (named && !kv_->TryGet("err/" + std::to_string(*named))) lost = named;
  }
  // A peer named by a timeout, not known to be gone: it sent nothing (it may hang).
  const bool named_on_timeout = lost && timeout && reporter < 0 && !DeadLocalRank();
  kv_->Set("err/" + std::to_string(rank_), std::to_string(lost ? *lost : -1)).ok();
  if (!lost) {
    // Ranks connected to the dead one report within moments of its death; a rank that
    // timed out has waited far longer than that, so a short look suffices.
    auto deadline = std::chrono::steady_clock::now() +
                    std::min<std::chrono::milliseconds>(timeout_ / 4 + 1ms, 2000ms);
    while (!lost && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
      lost = DeadLocalRank();
      if (!lost) lost = ReportedLostRank(&reporter);
    }
  }
  // Nothing found lost, and the wait timed out: a rank alive but silent (hung, stopped or
  // far behind) is the one other rank that reported no failure of its own, since every
  // rank waiting on it times out and reports.
  std::optional<int> silent;
  if (named_on_timeout) silent = lost;
  if (!lost && timeout) silent = SilentRank();
  std::string text = std::string(op_name) + " on rank " + std::to_string(rank_) + " of " +
                     std::to_string(world_) + " failed: ";
  if (silent) {
    text += "rank " + std::to_string(*silent) + " sent nothing for " + Seconds(timeout_) +
            " (the comm timeout, --comm-timeout; host " + ReadableHost(addresses_[*silent]) +
            "): it died, hangs or is far behind; ";
  } else if (lost) {
    text += "lost rank " + std::to_string(*lost) + " (" + "host " +
            ReadableHost(addresses_[*lost]) + ")";
    if (reporter >= 0) text += " as reported by rank " + std::to_string(reporter);
    text += timeout ? " (no data within the comm timeout of " + std::to_string(timeout_.count()) +
                          " ms); "
                    : "; ";
  } else if (timeout) {
    text += "no data from a peer within the comm timeout of " + std::to_string(timeout_.count()) +
            " ms (a rank died, hangs or is slow); ";
  }
  text += msg;
  return timeout ? Status::Timeout(text) : Status::Comm(text);
}

// The one other rank that reported no failure when every other one did, if exactly one.
std::optional<int> PeerLossForensics::SilentRank() {
  std::optional<int> silent;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || kv_->TryGet("err/" + std::to_string(r))) continue;
    if (silent) return std::nullopt;  // two or more: no single culprit
    silent = r;
  }
  return silent;
}

// The lowest-numbered other rank on this host whose process has exited without
// reporting a failure of its own (a rank that reported gave up after a loss; its exit is
// a consequence), if any.
std::optional<int> PeerLossForensics::DeadLocalRank() {
  for (int r = 0; r < world_; ++r) {
    if (r != rank_ && ProcessIsGone(identities_[r]) && !kv_->TryGet("err/" + std::to_string(r))) {
      return r;
    }
  }
  return std::nullopt;
}

// The lost rank named by the lowest-numbered other rank that reported one, if any.
std::optional<int> PeerLossForensics::ReportedLostRank(int* reporter) {
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    std::optional<std::string> v = kv_->TryGet("err/" + std::to_string(r));
    if (!v) continue;
    int l = std::atoi(v->c_str());
    if (l >= 0 && l < world_ && l != rank_) {
      *reporter = r;
      return l;
    }
  }
  return std::nullopt;
}

}  // namespace strata::gloo_internal
