// Communicator: the collectives that tie N ranks of a run together (ZeRO-3 sharding), and
// how ranks find each other.
//
// A Communicator joins `world_size` ranks, one per process. Each collective is issued on
// every rank, in the same order, with the same sizes; it runs asynchronously and returns a
// CommHandle whose Wait() gives its Status. Two backends implement it:
//   - Gloo (comm/gloo_communicator.h): TCP between hosts, buffers in host memory. Used by
//     HostDevice runs and for host-side reductions.
//   - NCCL (comm/nccl_communicator.h): buffers in device memory; collectives run on the
//     device's Lane::kComm stream, so `CollectiveOptions::after` becomes a stream wait.
// Both meet through a KeyValueStore (the rendezvous: a folder every rank sees, or a Redis
// server): Gloo exchanges its TCP addresses there, NCCL its ncclUniqueId.
//
// Failures: a collective that cannot complete within the communicator's timeout returns
// Timeout; a lost connection returns Comm. Either message names the lost rank when it can
// be inferred ("all-reduce on rank 0 of 4 failed: lost rank 2 (host 10.0.0.7); ..."). After the
// first failed collective the communicator is broken: every later collective fails at once with
// Aborted and the original cause, because the ranks no longer agree on where they are.
//
// Thread safety: collectives must be issued from one thread at a time and in the same order
// on every rank (the order defines which calls match across ranks). Handles may be waited on
// from any thread, any number of times. rank()/world_size() are safe from any thread.
// Buffers passed to a collective belong to the caller but must stay valid and untouched
// (inputs unmodified, outputs unread) until its handle is complete.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "strata/device.h"
#include "strata/status.h"

namespace strata {

// ---------------------------------------------------------------------------------------
// Ranks and rendezvous
// ---------------------------------------------------------------------------------------

// Who this process is within the run.
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // index among the ranks on this host
  // Ranks on this host. 0 = unknown, taken as all of them (a single-host run);
  // RankInfoFromEnv sets it (to world_size when the launcher does not say).
  int local_world_size = 0;
  std::string source;  // where it came from: "torchrun", "Open MPI", "Slurm"
};

// Reads a variable of the environment; nullopt when unset. Lets tests supply their own.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// Discovers the rank from the environment, trying in order:
//   RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE          (torchrun, strata launch)
//   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE   (Open MPI's mpirun)
//   SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID                (Slurm's srun)
// The first family whose rank variable is set wins. Missing local rank defaults to 0 when
// world_size is 1 and is an error otherwise. Errors: NotFound when no family is set (the
// message lists the variables to set); InvalidArgument naming the variable and its value
// when a value is not an integer, a size is missing, or rank/local_rank is out of range.
Result<RankInfo> RankInfoFromEnv(const EnvLookup& lookup);
Result<RankInfo> RankInfoFromEnv();  // the process environment

// Where ranks meet: `file:DIR` (a folder all ranks see, e.g. on NFS; use a fresh folder
// per run, since stale keys from an earlier run make rendezvous fail) or a Redis server,
// `redis://[[USER]:PASSWORD@]HOST[:PORT][/PREFIX]` (or `redis:HOST:PORT`). In Redis every key
// of the run lies under PREFIX/; each process deletes the keys it wrote when its
// communicator goes away, so a run that ended leaves nothing behind, and the keys of one that
// crashed are refused by the next run with the same prefix, naming them and how to delete
// them.
//
// Authentication (docs/multirank.md, "Securing the rendezvous"): a Redis server with
// `requirepass` (or ACL users) is sent AUTH with `password` (and `user`); an empty password
// is taken from STRATA_REDIS_PASSWORD, which keeps it out of `ps`. A run secret
// (`run_secret`, else STRATA_RUN_SECRET; `strata launch` makes one) signs every key a rank
// publishes with HMAC-SHA256 over the key's name and value: a rank ignores, and names, any
// key that does not verify, so a process without the secret can neither join nor forge
// another rank's endpoints.
struct RendezvousSpec {
  enum class Kind : uint8_t { kFile, kRedis };
  Kind kind = Kind::kFile;
  std::string path;        // kFile
  std::string host;        // kRedis
  int port = 0;            // kRedis
  std::string prefix;      // kRedis: the run's namespace ("" = none)
  std::string user;        // kRedis: ACL user for AUTH ("" = the default user)
  std::string password;    // kRedis: AUTH password ("" = STRATA_REDIS_PASSWORD, else none)
  std::string run_secret;  // HMAC key of the run's keys ("" = STRATA_RUN_SECRET, else none)
  // Back to "file:DIR" / "redis://[USER[:***]@]HOST:PORT[/PREFIX]": never shows the
  // password or the run secret, so it is safe in messages and JSON.
  std::string ToString() const;
};

// Parses "file:DIR", "redis://[[USER]:PASSWORD@]HOST[:PORT][/PREFIX]" (port 6379 by default;
// USER and PASSWORD may use %XX escapes, e.g. %40 for '@' and %2F for '/') or
// "redis:HOST:PORT" (HOST may be [v6addr]). InvalidArgument naming the text (with the
// password masked) and the accepted forms otherwise. Does not touch the file system, the
// network or the environment.
Result<RendezvousSpec> ParseRendezvous(std::string_view text);

// A small shared key-value store reachable by every rank, used to exchange addresses and
// ids before collectives exist. Keys are written once per run. Safe for concurrent use.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Stores `value` under `key`. IOError (or InvalidArgument when the key already exists,
  // typically a stale folder from an earlier run) on failure.
  virtual Status Set(const std::string& key, std::string_view value) = 0;
  // Blocks until `key` exists (at most `timeout`), then returns its value. Timeout naming
  // the key when it does not appear in time; IOError when the store is unreachable.
  virtual Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// Opens the store named by `spec`; every key is prefixed with `prefix` so that several
// communicators (or runs sharing one Redis) do not collide. Implemented by the Gloo
// backend: NotSupported when this build's Gloo lacks Redis; IOError/NotFound naming the
// folder or server when it is unreachable.
Result<std::shared_ptr<KeyValueStore>> OpenKeyValueStore(const RendezvousSpec& spec,
                                                         const std::string& prefix);

// Process-wide: `check` is polled (every few milliseconds) while a rank waits in the
// rendezvous (for the other ranks, or for a key); when it returns non-zero, the signal
// number that asked this process to stop, the wait ends with Aborted naming that signal, and
// the keys the rank wrote are deleted on the way out. nullptr (the default): waits run to
// their timeout. The CLI passes its SIGINT/SIGTERM flag. Safe to call from any thread.
void SetRendezvousInterruptCheck(int (*check)());

// ---------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------

enum class CommDataType : uint8_t {
  kFloat32 = 0,
  kByte = 1,  // raw bytes: all-gather and broadcast only (no arithmetic)
};
inline size_t CommDataTypeSize(CommDataType t) { return t == CommDataType::kFloat32 ? 4 : 1; }
inline const char* CommDataTypeName(CommDataType t) {
  return t == CommDataType::kFloat32 ? "fp32" : "bytes";
}

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,  // the sum divided by world_size (a division, not a multiply by 1/N)
  kMax = 2,
};
inline const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

// The result of one asynchronous collective. Copyable; all copies share the outcome.
// A default-constructed handle is complete and OK.
class [[nodiscard]] CommHandle {
 public:
  // Implemented by each backend.
  class Impl {
   public:
    virtual ~Impl() = default;
    // Blocks until the collective is finished; its status (same on every call).
    virtual Status Wait() = 0;
    // True once finished, successfully or not. Never blocks.
    virtual bool Done() = 0;
  };

  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  // A handle that is already complete with `status` (e.g. invalid arguments).
  static CommHandle Completed(Status status) {
    class CompletedImpl final : public Impl {
     public:
      explicit CompletedImpl(Status s) : status_(std::move(s)) {}
      Status Wait() override { return status_; }
      bool Done() override { return true; }

     private:
      Status status_;
    };
    return CommHandle(std::make_shared<CompletedImpl>(std::move(status)));
  }

  // Blocks until complete. The collective's own timeout bounds the wait: a dead peer
  // produces Timeout or Comm, never a hang.
  Status Wait() const { return impl_ ? impl_->Wait() : Status::OK(); }
  bool Done() const { return impl_ ? impl_->Done() : true; }

 private:
  std::shared_ptr<Impl> impl_;
};

// Per-call options.
struct CollectiveOptions {
  // When set, the collective starts only after this event completes (Gloo: its worker
  // synchronises the event; NCCL: the comm stream waits on it). This is how a gather is
  // ordered after the copies that fill its input. An error of the event fails the
  // collective (and breaks the communicator).
  EventPtr after;
  // Names the operation in observer records and traces ("all-gather block 3").
  std::string_view label;
};

// One finished collective, reported to the observer (statistics, traces).
struct CommOpRecord {
  std::string_view op;     // "all-gather", "reduce-scatter", "all-reduce", ...
  std::string_view label;  // CollectiveOptions::label
  std::chrono::steady_clock::time_point start, end;  // while it ran (not while queued)
  // Bytes each rank moves under a bandwidth-optimal algorithm (nccl-tests' "bus" bytes):
  // (N-1)/N of the full buffer for all-gather and reduce-scatter, 2(N-1)/N for all-reduce,
  // the buffer for broadcast, 0 for barrier. Divided by end-start: bus bandwidth.
  uint64_t bytes = 0;
  bool ok = true;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo", "nccl"
  virtual const char* backend() const = 0;
  // True when buffers must be device memory (NCCL), false for host memory (Gloo).
  virtual bool device_buffers() const = 0;

  // All-gather: each rank contributes `count` elements from `input`; `output` receives
  // world_size * count elements, rank r's at [r*count, (r+1)*count). `input` may alias
  // output + rank*count (in place). count may be 0.
  virtual CommHandle AllGather(const void* input, void* output, size_t count, CommDataType type,
                               const CollectiveOptions& options = {}) = 0;

  // Reduce-scatter: `input` holds world_size * count elements; rank r receives in `output`
  // (count elements) the reduction over ranks of input[r*count, (r+1)*count). kFloat32 only;
  // op kSum or kAverage. `output` may be input + rank*count (in place: only that slot of
  // `input` changes); otherwise it must not overlap `input`, which is then not modified.
  virtual CommHandle ReduceScatter(const void* input, void* output, size_t count, CommDataType type,
                                   ReduceOp op, const CollectiveOptions& options = {}) = 0;

  // All-reduce of `count` elements; `input` may equal `output` (in place). kFloat32 only.
  // Every rank receives bit-identical results.
  virtual CommHandle AllReduce(const void* input, void* output, size_t count, CommDataType type,
                               ReduceOp op, const CollectiveOptions& options = {}) = 0;

  // Broadcast: `count` elements of `buffer` on `root` are copied into `buffer` on every
  // other rank.
  virtual CommHandle Broadcast(void* buffer, size_t count, CommDataType type, int root,
                               const CollectiveOptions& options = {}) = 0;

  // Completes once every rank has issued it (and all earlier collectives are done).
  virtual CommHandle Barrier(const CollectiveOptions& options = {}) = 0;

  // The store this communicator met through, for exchanging more bytes (e.g. a second
  // communicator's id). Shared; outlives the communicator if the caller keeps it.
  virtual std::shared_ptr<KeyValueStore> store() const = 0;

  // Receives every finished collective (called from the backend's worker thread; must be
  // cheap and thread-safe). nullptr removes it. Set before issuing collectives.
  virtual void SetObserver(std::function<void(const CommOpRecord&)> observer) = 0;
};

// How to build a communicator.
struct CommOptions {
  RankInfo rank;              // usually from RankInfoFromEnv()
  RendezvousSpec rendezvous;  // usually ParseRendezvous(--rendezvous or STRATA_RENDEZVOUS)
  // Bounds every collective and the rendezvous itself; a rank that dies makes the others
  // fail within about this long. STRATA_COMM_TIMEOUT (seconds) sets the CLI default.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Host name or address the Gloo transport listens on and advertises to the others.
  // Empty: STRATA_COMM_HOST; if that is empty too, the address of the network interface
  // GLOO_SOCKET_IFNAME names (as torch's Gloo reads it); else "127.0.0.1" when all ranks are
  // on this host (rank.local_world_size is 0 or world_size), else the name gethostname()
  // returns.
  // When ranks span hosts, a name resolving only to loopback is refused (InvalidArgument).
  std::string hostname;
  // Prefix of this communicator's keys in the store; distinct per communicator sharing a
  // store (and per run sharing a Redis server).
  std::string store_prefix = "strata";
};

// The Gloo backend (TCP). Joins the others through `options.rendezvous` and connects a full
// mesh; blocks until every rank has joined or options.timeout passes (Timeout naming the
// ranks that never appeared). NotSupported for redis: when this build's Gloo lacks Redis.
// Sets SIGPIPE to ignored when it has its default action (Gloo's socket writes would
// otherwise let a dying peer kill this process).
Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options);

// The NCCL backend (device buffers; comm/nccl_communicator.h has the details and a form that
// takes an id shared some other way). Rank 0 creates an ncclUniqueId and stores it under
// "<options.store_prefix>/nccl_id" in `store` (typically another communicator's store(), e.g.
// a Gloo one joined first: give this one a distinct store_prefix); the other ranks read it,
// waiting up to options.timeout. Then every rank joins, blocking until all have (Timeout
// after options.timeout). Collectives run on `device`'s Lane::kComm stream, so they order
// with the device's events, and the buffers must be that device's memory. options.rendezvous
// and options.hostname are not used (the store is the rendezvous). `device` is not owned and
// must outlive the communicator; store() returns `store`.
// Errors: NotSupported ("this build has no CUDA/NCCL ...") in a build without CUDA;
// InvalidArgument when `device` is not a CUDA device (a HostDevice: use Gloo), when `store`
// is null, or for a bad rank/world size; InvalidArgument from the store when the key is
// stale (an earlier run's folder); Timeout naming the key when rank 0 never stores the id;
// Comm (NCCL) or Cuda (CUDA) failures naming the call.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options,
                                                             std::shared_ptr<KeyValueStore> store,
                                                             Device& device);

// The comm timeout from STRATA_COMM_TIMEOUT (seconds, may be fractional); InvalidArgument
// naming the value when it is not a positive number.
Result<std::chrono::milliseconds> CommTimeoutFromEnv();

}  // namespace strata
