// Rank discovery from launcher environments, rendezvous specs and the comm timeout: the
// backend-independent parts of strata/comm.h.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "strata/comm.h"
#include "strata/env.h"

namespace strata {
namespace {

struct EnvFamily {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // may be absent in the environment
};

constexpr EnvFamily kFamilies[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

// Parses a whole decimal integer; InvalidArgument naming the variable otherwise.
Result<int> ParseIntVar(const char* name, const std::string& value) {
  int out = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  if (value.empty() || ec != std::errc() || ptr != last) {
    return Status::InvalidArgument(std::string(name) + "='" + value +
                                   "' is not an integer; fix or unset it");
  }
  return out;
}

}  // namespace

Result<RankInfo> RankInfoFromEnv(const EnvLookup& lookup) {
  for (const EnvFamily& f : kFamilies) {
    std::optional<std::string> rank_s = lookup(f.rank);
    if (!rank_s) continue;
    RankInfo info;
    info.source = f.source;
    STRATA_ASSIGN_OR_RETURN(info.rank, ParseIntVar(f.rank, *rank_s));
    std::optional<std::string> size_s = lookup(f.size);
    if (!size_s) {
      return Status::InvalidArgument(std::string(f.rank) + " is set (" + f.source + ") but " +
                                     f.size + " is not; set both");
    }
    STRATA_ASSIGN_OR_RETURN(info.world_size, ParseIntVar(f.size, *size_s));
    if (info.world_size < 1) {
      return Status::InvalidArgument(std::string(f.size) + "=" + *size_s + " must be >= 1");
    }
    if (info.rank < 0 || info.rank >= info.world_size) {
      return Status::InvalidArgument(std::string(f.rank) + "=" + *rank_s + " is outside [0, " +
                                     f.size + "=" + *size_s + ")");
    }
    std::optional<std::string> local_s = lookup(f.local_rank);
    if (local_s) {
      STRATA_ASSIGN_OR_RETURN(info.local_rank, ParseIntVar(f.local_rank, *local_s));
    } else if (info.world_size == 1) {
      info.local_rank = 0;
    } else {
      return Status::InvalidArgument(std::string(f.rank) + " and " + f.size + " are set (" +
                                     f.source + ") but " + f.local_rank +
                                     " is not; set it to this process's index on its host");
    }
    info.local_world_size = info.world_size;
    // Slurm's SLURM_NTASKS_PER_NODE may read "2(x3)" for heterogeneous layouts; only a
    // plain integer is used, else the local size stays unknown (= world size).
    if (std::optional<std::string> ls = lookup(f.local_size)) {
      Result<int> v = ParseIntVar(f.local_size, *ls);
      if (v.ok() && *v >= 1 && *v <= info.world_size) info.local_world_size = *v;
    }
    if (info.local_rank < 0 || info.local_rank >= info.world_size) {
      return Status::InvalidArgument(std::string(f.local_rank) + "=" + *local_s +
                                     " is outside [0, " + f.size + "=" + *size_s + ")");
    }
    if (info.local_rank >= info.local_world_size) info.local_world_size = info.world_size;
    return info;
  }
  return Status::NotFound(
      "no rank in the environment: set RANK, WORLD_SIZE and LOCAL_RANK (as torchrun and "
      "`strata launch` do), or start the ranks with Open MPI's mpirun or Slurm's srun");
}

Result<RankInfo> RankInfoFromEnv() {
  return RankInfoFromEnv([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

std::string RendezvousSpec::ToString() const {
  if (kind == Kind::kFile) return "file:" + path;
  bool v6 = host.find(':') != std::string::npos;
  std::string auth;
  if (!user.empty()) auth = user + (password.empty() ? "" : ":***") + "@";
  if (user.empty() && !password.empty()) auth = ":***@";
  return "redis://" + auth + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) +
         (prefix.empty() ? "" : "/" + prefix);
}

namespace {

// `text` with the password of a redis:// URL's USER:PASSWORD@ replaced by ***, for messages.
std::string MaskPassword(std::string_view text) {
  if (!text.starts_with("redis://")) return std::string(text);
  const size_t end = text.find('/', 8);
  const size_t at = text.substr(0, end).rfind('@');
  if (at == std::string_view::npos) return std::string(text);
  const size_t colon = text.substr(0, at).find(':', 8);
  if (colon == std::string_view::npos) return std::string(text);
  return std::string(text.substr(0, colon + 1)) + "***" + std::string(text.substr(at));
}

// Decodes %XX escapes (RFC 3986); false on a malformed one.
bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int v = 0;
    auto [ptr, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, v, 16);
    if (ec != std::errc() || ptr != in.data() + i + 3) return false;
    out->push_back(static_cast<char>(v));
    i += 2;
  }
  return true;
}

}  // namespace

Result<RendezvousSpec> ParseRendezvous(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("rendezvous '" + MaskPassword(text) + "': " + why +
                                   "; expected file:DIR (a folder every rank sees) or "
                                   "redis://[[USER]:PASSWORD@]HOST[:PORT][/PREFIX] (or "
                                   "redis:HOST:PORT)");
  };
  RendezvousSpec spec;
  if (text.starts_with("file:")) {
    spec.kind = RendezvousSpec::Kind::kFile;
    spec.path = std::string(text.substr(5));
    if (spec.path.empty()) return bad("the folder is empty");
    return spec;
  }
  if (text.starts_with("redis:")) {
    spec.kind = RendezvousSpec::Kind::kRedis;
    // redis://HOST[:PORT][/PREFIX] (the URL form; port 6379 by default) or redis:HOST:PORT.
    const bool url = text.starts_with("redis://");
    std::string_view rest = text.substr(url ? 8 : 6);
    if (url) {
      const size_t slash = rest.find('/', rest.starts_with("[") ? rest.find(']') : 0);
      if (slash != std::string_view::npos) {
        spec.prefix = std::string(rest.substr(slash + 1));
        rest = rest.substr(0, slash);
      }
      // USER:PASSWORD@, :PASSWORD@ or USER@ before the host (the last '@': a password may
      // hold one unescaped).
      if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
        const std::string_view info = rest.substr(0, at);
        const size_t colon = info.find(':');
        if (!PercentDecode(info.substr(0, colon), &spec.user) ||
            (colon != std::string_view::npos &&
             !PercentDecode(info.substr(colon + 1), &spec.password))) {
          return bad("a malformed %XX escape in USER:PASSWORD@");
        }
        if (colon != std::string_view::npos && spec.password.empty()) {
          return bad(
              "the password after ':' is empty (leave out USER:PASSWORD@, or set "
              "STRATA_REDIS_PASSWORD)");
        }
        rest = rest.substr(at + 1);
      }
    }
    std::string_view port_s;
    bool has_port = true;
    if (rest.starts_with("[")) {
      size_t close = rest.find(']');
      if (close == std::string_view::npos) return bad("unclosed '[' in the host");
      spec.host = std::string(rest.substr(1, close - 1));
      rest = rest.substr(close + 1);
      has_port = rest.starts_with(":");
      if (!has_port && !(url && rest.empty())) return bad("missing :PORT");
      if (has_port) port_s = rest.substr(1);
    } else {
      size_t colon = rest.rfind(':');
      has_port = colon != std::string_view::npos;
      if (!has_port && !url) return bad("missing :PORT");
      spec.host = std::string(rest.substr(0, has_port ? colon : rest.size()));
      if (has_port) port_s = rest.substr(colon + 1);
    }
    if (spec.host.empty()) return bad("the host is empty");
    int port = 6379;
    if (has_port) {
      auto [ptr, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
      if (port_s.empty() || ec != std::errc() || ptr != port_s.data() + port_s.size() || port < 1 ||
          port > 65535) {
        return bad("port '" + std::string(port_s) + "' is not in 1..65535");
      }
    }
    spec.port = port;
    return spec;
  }
  return bad("unknown scheme");
}

Result<std::chrono::milliseconds> CommTimeoutFromEnv() {
  std::string s = EnvGet("STRATA_COMM_TIMEOUT");
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(seconds) ||
      seconds <= 0) {
    return Status::InvalidArgument("STRATA_COMM_TIMEOUT='" + s +
                                   "' is not a positive number of seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

}  // namespace strata
