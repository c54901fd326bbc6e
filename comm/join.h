// Joining the ranks of a run from a command line's flags: rank discovery, the rendezvous, the
// Gloo communicator that carries the host-side collectives, and the NCCL one for the engine's
// collectives on a CUDA device (meeting the others through the Gloo communicator's store).
// The trainer's run set-up (trainer/run_setup.h), which `strata train` and `strata bench
// step` share, calls these; `strata launch` uses TempFolder for its rendezvous folder.
//
// Nothing here prints: each function returns a Status whose message names the flag and the
// value, and the caller reports it in its own style. No shared state: the functions may be
// called from any thread; a TempFolder or JoinedRanks belongs to its creator.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "strata/comm.h"
#include "strata/device.h"
#include "strata/status.h"

namespace strata {

// A fresh folder, removed with everything in it when this object is destroyed (or another
// folder is made through it). Movable, not copyable.
class TempFolder {
 public:
  TempFolder() = default;
  ~TempFolder() { Remove(); }
  TempFolder(TempFolder&& other) noexcept;
  TempFolder& operator=(TempFolder&& other) noexcept;
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  // Creates the folder `prefix` + six random characters (mkdtemp), e.g. with prefix
  // "/tmp/strata-train-rdzv-"; the prefix decides where it lives, so each caller keeps its
  // own location (/tmp, /var/tmp, $TMPDIR). Returns its path. A folder made before through
  // this object is removed first. Errors: mkdtemp's errno as a Status (NotFound when the
  // parent folder is missing, IOError otherwise) naming the template.
  Result<std::string> Make(const std::string& prefix);

  // "" until Make succeeds.
  const std::string& path() const { return path_; }
  // Keeps the folder: returns its path and forgets it, so it is not removed.
  std::string Release() { return std::exchange(path_, {}); }

 private:
  void Remove();

  std::string path_;
};

// `path` with every {rank} and {local_rank} replaced by the rank's numbers, so that one
// flag value names each rank's own folder or file (--nvme /nvme/{rank}). Never fails.
std::string RankPath(std::string path, const RankInfo& rank);

// This process's rank from the launcher's environment (RankInfoFromEnv); a single rank
// (world size 1, local world size 1) when no launcher variable is set. Errors:
// RankInfoFromEnv's InvalidArgument for set but inconsistent variables.
Result<RankInfo> RankFromEnvOrSingle();

// How a subcommand's ranks meet: its --rendezvous and --comm-timeout flags, and the names
// it gives its keys and its temporary folder.
struct JoinOptions {
  // --rendezvous: file:DIR or redis://HOST:PORT/PREFIX. Empty: STRATA_RENDEZVOUS; if that
  // is unset too and MASTER_ADDR is (torchrun), redis://MASTER_ADDR:6379/strata-ID with ID
  // TORCHELASTIC_RUN_ID, else MASTER_PORT; else a one-rank run meets itself in a fresh
  // folder (below), and more ranks are refused.

  std::string rendezvous;
  // --comm-timeout in seconds (rounded up to whole milliseconds). 0: STRATA_COMM_TIMEOUT
  // (default 300 s). Negative values are refused.
  double timeout_seconds = 0;
  // Prefix of the Gloo communicator's keys in the store ("strata-train"); the NCCL one
  // made by CreateEngineNccl uses this + "-nccl".
  std::string store_prefix;
  // Where a one-rank run without a rendezvous meets itself (it joins only so that
  // --comm-backend nccl runs the engine's collectives through NCCL on one GPU): a
  // TempFolder made with this prefix, e.g. "/tmp/strata-train-rdzv-".
  std::string one_rank_folder_prefix;
  // --run-secret VALUE or --run-secret-file PATH (comm/run_secret.h: RunSecretFromFlags),
  // with which every rank signs its rendezvous keys; both empty: STRATA_RUN_SECRET.
  std::string run_secret;
  std::string run_secret_file;
};

// The ranks of a run, joined: the Gloo communicator (host memory) that carries the
// host-side collectives, the options it was made with (the NCCL one starts from them), and
// the temporary rendezvous folder of a one-rank run, if any. Members are destroyed in
// reverse order, so the communicator goes before its folder. Default-constructed: no
// communicator (a one-rank run without collectives).
struct JoinedRanks {
  TempFolder folder;
  CommOptions options;
  std::unique_ptr<Communicator> gloo;
};

// Joins the other ranks of `rank`'s run over Gloo, as `options` says; blocks until all
// have joined (or the timeout passes). Call it only when the run needs communicators
// (several ranks, or --comm-backend nccl on one). Errors, each with *failed_step (when not
// null) set to what failed, which `strata train` prints before the status:
//   "--comm-backend nccl": the one-rank rendezvous folder could not be made (TempFolder);
//   "--rendezvous": none given with several ranks (InvalidArgument naming WORLD_SIZE and
//     how to give one), or not a valid rendezvous (ParseRendezvous's error);
//   "--comm-timeout": a negative value (InvalidArgument);
//   "--run-secret-file": both secret flags, or the file cannot give one (RunSecretFromFlags);
//   "STRATA_COMM_TIMEOUT": the variable is not a positive number (InvalidArgument);
//   "joining the other ranks": CreateGlooCommunicator failed (Timeout naming the ranks that
//     never appeared, InvalidArgument for a stale rendezvous, ...).
Result<JoinedRanks> JoinRanks(const RankInfo& rank, const JoinOptions& options,
                              std::string* failed_step);

// The NCCL communicator for the engine's parameter all-gathers and gradient reduce-scatters
// when --comm-backend (`comm_backend`) asks for one: "nccl", or "auto" on a CUDA device.
// It meets the others through `ranks.gloo`'s store. Returns nullptr when the ranks did not
// join (no `ranks.gloo`) or Gloo is to carry the engine's collectives too. `device` must
// outlive the communicator (which runs on its comm stream): declare the result after the
// device and before the engine that uses it. Errors: CreateNcclCommunicator's (NotSupported
// in a build without CUDA, InvalidArgument for a host device, Timeout, Comm, Cuda), not
// annotated: callers name the flag.
Result<std::unique_ptr<Communicator>> CreateEngineNccl(const JoinedRanks& ranks,
                                                       const std::string& comm_backend,
                                                       Device& device);

}  // namespace strata
