// Joining a run's ranks from the CLI's flags; see join.h.
#include "comm/join.h"

#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "comm/run_secret.h"

namespace strata {
namespace {

// --comm-timeout (seconds; 0 = STRATA_COMM_TIMEOUT). Rounded up, so that a fraction of a
// millisecond does not become no timeout at all.
Result<std::chrono::milliseconds> CommTimeout(double seconds, std::string* failed_step) {
  if (seconds > 0) {
    return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1e3)));
  }
  if (seconds < 0) {
    *failed_step = "--comm-timeout";
    return Status::InvalidArgument("--comm-timeout " + std::to_string(seconds) +
                                   ": expected a positive number of seconds");
  }
  auto from_env = CommTimeoutFromEnv();
  if (!from_env.ok()) *failed_step = "STRATA_COMM_TIMEOUT";
  return from_env;
}

}  // namespace

Result<RankInfo> RankFromEnvOrSingle() {
  RankInfo ri;
  ri.local_world_size = 1;
  auto r = RankInfoFromEnv();
  if (r.ok()) return r;
  if (r.status().code() != StatusCode::kNotFound) return r.status();
  return ri;
}

std::string RankPath(std::string path, const RankInfo& rank) {
  for (const auto& [key, value] : {std::pair<std::string, int>{"{rank}", rank.rank},
                                   std::pair<std::string, int>{"{local_rank}", rank.local_rank}}) {
    for (size_t p = path.find(key); p != std::string::npos; p = path.find(key, p)) {
      const std::string v = std::to_string(value);
      path.replace(p, key.size(), v);
      p += v.size();
    }
  }
  return path;
}

TempFolder::TempFolder(TempFolder&& other) noexcept : path_(std::exchange(other.path_, {})) {}

TempFolder& TempFolder::operator=(TempFolder&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::exchange(other.path_, {});
  }
  return *this;
}

Result<std::string> TempFolder::Make(const std::string& prefix) {
  Remove();
  std::string tmpl = prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    // mkdtemp may have filled in the Xs already: name the template as given.
    return Status::FromErrno(errno, "creating the temporary folder " + prefix + "XXXXXX");
  }
  path_ = tmpl;
  return path_;
}

void TempFolder::Remove() {
  if (path_.empty()) return;
  std::error_code ec;  // best effort: a folder left behind must not fail the run
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

Result<JoinedRanks> JoinRanks(const RankInfo& rank, const JoinOptions& options,
                              std::string* failed_step) {
  std::string ignored;
  if (failed_step == nullptr) failed_step = &ignored;
  JoinedRanks joined;
  std::string where = options.rendezvous;
  if (where.empty()) {
    const char* env = std::getenv("STRATA_RENDEZVOUS");
    where = env ? env : "";
  }
  // torchrun (and other launchers that follow its variables) name the first host in
  // MASTER_ADDR: without a rendezvous, the run meets in a Redis server there, on the default
  // port, under a prefix of its own run (TORCHELASTIC_RUN_ID, else MASTER_PORT). Gloo has no
  // TCP store of its own to serve from rank 0, and torch's on MASTER_PORT is not ours.
  std::string derived_from;
  const char* master = std::getenv("MASTER_ADDR");
  if (where.empty() && rank.world_size > 1 && master != nullptr && *master != '\0') {
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    const char* port = std::getenv("MASTER_PORT");
    const std::string id = run_id != nullptr && *run_id != '\0' ? run_id
                           : port != nullptr                    ? port
                                                                : "0";
    const std::string host = std::string(master).find(':') != std::string::npos
                                 ? "[" + std::string(master) + "]"
                                 : std::string(master);
    where = "redis://" + host + ":6379/strata-" + id;
    derived_from = " (derived from MASTER_ADDR" +
                   std::string(run_id != nullptr && *run_id != '\0' ? " and TORCHELASTIC_RUN_ID"
                                                                    : " and MASTER_PORT") +
                   ": run redis-server on port 6379 there, or pass --rendezvous)";
  }
  if (where.empty() && rank.world_size == 1) {
    auto dir = joined.folder.Make(options.one_rank_folder_prefix);
    if (!dir.ok()) {
      *failed_step = "--comm-backend nccl";
      return dir.status();
    }
    where = "file:" + *dir;
  }
  if (where.empty()) {
    *failed_step = "--rendezvous";
    return Status::InvalidArgument("WORLD_SIZE is " + std::to_string(rank.world_size) +
                                   " but no rendezvous was given: pass --rendezvous file:DIR or "
                                   "redis://HOST:PORT/PREFIX (or set "
                                   "STRATA_RENDEZVOUS; `strata launch` does)");
  }
  auto spec = ParseRendezvous(where);
  if (!spec.ok()) {
    *failed_step = "--rendezvous";
    return spec.status();
  }
  auto secret = RunSecretFromFlags(options.run_secret, options.run_secret_file);
  if (!secret.ok()) {
    *failed_step = "--run-secret-file";
    return secret.status();
  }
  if (!secret->empty()) spec->run_secret = *secret;
  joined.options.rank = rank;
  joined.options.rendezvous = *spec;
  joined.options.store_prefix = options.store_prefix;
  STRATA_ASSIGN_OR_RETURN(joined.options.timeout,
                          CommTimeout(options.timeout_seconds, failed_step));
  *failed_step = "joining the other ranks";
  auto gloo = CreateGlooCommunicator(joined.options);
  if (!gloo.ok()) {
    if (!derived_from.empty()) *failed_step += " through " + where + derived_from;
    return gloo.status();
  }
  joined.gloo = std::move(*gloo);
  failed_step->clear();
  return joined;
}

Result<std::unique_ptr<Communicator>> CreateEngineNccl(const JoinedRanks& ranks,
                                                       const std::string& comm_backend,
                                                       Device& device) {
  const bool wanted =
      comm_backend == "nccl" || (comm_backend == "auto" && device.Kind() == DeviceKind::kCuda);
  if (ranks.gloo == nullptr || !wanted) return std::unique_ptr<Communicator>();
  CommOptions options = ranks.options;
  options.store_prefix = ranks.options.store_prefix + "-nccl";
  return CreateNcclCommunicator(options, ranks.gloo->store(), device);
}

}  // namespace strata
