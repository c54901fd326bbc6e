// SwapStore: the NVMe tier — named extents in preallocated files striped across drives,
// every byte checksummed, crash-consistent at commit boundaries.
//
// Layout. The store spans one or more folders (one per NVMe drive). Folder i holds one data
// file, "strata.swap.<i>-of-<n>", preallocated (fallocate) at Open, and a marker
// "strata.stripe" naming the store and the folder's place in it (io/stripe_marker.h): a
// resume that gives the folders in another order, or only some, is refused naming them, and
// so is a fresh store over any folder of another store's committed state. Folder 0 also
// holds the manifest "strata.manifest". Every folder holds a lock file "strata.lock" (flock'ed for
// the store's life, naming the holder's pid): two stores can never share a folder. Every file is
// opened relative to its folder's descriptor with O_NOFOLLOW; a symbolic link, a
// non-regular file or a hard-linked file under a store name is refused, new files are
// created O_EXCL, and store files are created 0600. The files form one logical address space cut
// into fixed stripes (SwapStoreOptions::stripe_bytes): logical stripe s lives in file
// s % n at offset (s / n) * stripe. An extent is a 4 KiB-aligned range of that space, so an
// extent larger than a stripe is spread over the drives and its pieces are in flight
// together: n drives give about n times one drive's bandwidth.
//
// Extents. The caller names each extent with a key of its choosing ("block3/exp_avg").
// Write(key, data) puts the new contents at a FRESH location, never over the committed
// version, and records the length and the XXH3-64 of the bytes. Read(key) returns the newest
// completed version and verifies its checksum: a mismatch is Corruption naming the key, the
// data file and the offset. Lengths may be anything (0 included): the store pads the last
// 4 KiB block itself; the checksum covers exactly `length` bytes.
//
// Versions and commit. Each key has at most one committed version (in the manifest on disk)
// and one pending version (written since the last Commit). Commit(step) fdatasyncs every data
// file, then writes the manifest (key -> offset, length, checksum, step) to a temporary file,
// fsyncs it, renames it over the manifest and fsyncs folder 0. Re-opening after a crash at
// any instant (SIGKILL, power loss) gives exactly the versions of the last Commit that
// returned OK (or of one that was under way, if its rename reached the disk). The space of a
// superseded committed version is reused only after the Commit that superseded it, so the
// committed state stays readable until then; uncommitted writes lost in a crash are just
// free space on re-open.
//
// Buffers. Every buffer given to the store must be 4 KiB-aligned (kIoAlignment): the data
// files are opened with O_DIRECT. Allocate them from the PinnedPool. Only `length` bytes of
// a buffer are read or written; the store pads the tail through its own block. On a file
// system without O_DIRECT (tmpfs) the backend falls back to buffered I/O with a warning and
// the store works the same.
//
// Asynchronous use. SubmitWrite / SubmitRead / Submit (a batch) queue work and return
// tickets; Poll hands back completions (SwapCompletion) in the order they finish; Wait
// waits for one ticket. Poll never hands out the completion of a synchronous Write/Read,
// so an I/O thread may Poll while other threads use the synchronous calls. A write becomes visible
// to later reads (and to Commit) when its completion has been processed by Poll, Wait or Commit;
// two writes to one key in flight together resolve to the one submitted last. The caller keeps each
// buffer valid and unchanged until its completion is returned. Write / Read are the synchronous
// forms.
//
// Errors. Submit* fail directly only on invalid arguments (empty key, misaligned or null
// buffer); every other failure (NotFound key, NoSpace when the capacity is full, I/O errors,
// Corruption) arrives as the completion's status. A failed write leaves the key's previous
// version in place. ENOSPC from the disk is NoSpace and the committed state stays intact.
//
// Thread safety. All methods may be called from any thread. The I/O methods (Submit*, Poll,
// Wait, Write, Read, Delete, Commit, RegisterBuffers) are serialised by an internal mutex
// because the store drives one IoBackend, which takes one submitting thread at a time; a
// blocking Poll/Wait/Commit holds it, so the intended use is one I/O thread per store.
// Metadata queries (Lookup, Keys, CommittedStep, Stats) take only the metadata mutex and do
// not wait for I/O.
//
// Cost. Each stripe piece is one backend request (so keep stripe_bytes at the block size the
// drive likes, 1 MiB by default), plus one 4 KiB request for a partial last block. The
// checksum is computed on the submitting thread (writes) and on the thread that processes
// completions (reads): XXH3 runs at tens of GB/s per core.
//
// Typical use (the engine's I/O thread):
//   SwapStoreOptions o;  o.paths = {"/nvme0/strata", "/nvme1/strata"};
//   o.capacity_bytes = 64ull << 30;
//   STRATA_ASSIGN_OR_RETURN(auto store, SwapStore::Open(o));
//   BufferRegion arena{pool.base(), pool.size()};   // the PinnedPool, registered once
//   STRATA_RETURN_IF_ERROR(store->RegisterBuffers({&arena, 1}));
//   auto t = store->Submit(ops);            // reads of the next blocks, writes of the last
//   store->Poll(done, 1);                   // hand each finished buffer on
//   store->Commit(step);                    // at the step boundary
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "io/extent_table.h"
#include "io/swap_layout.h"
#include "strata/io.h"
#include "strata/status.h"

namespace strata {

namespace swap_internal {
struct Manifest;
class SwapFolders;
// The store's checksum of an extent (XXH3-64), and its path join (one '/' between), for the
// engine's other files beside the store (the activation stash's scratch files).
uint64_t Checksum64(const void* data, size_t length);
std::string JoinPath(const std::string& dir, const std::string& name);
}  // namespace swap_internal

struct SwapStoreOptions {
  // Folders, one per drive; each must exist and be writable. The order is part of the
  // store's layout: reopen with the same folders in the same order.
  std::vector<std::string> paths;
  // Total bytes of extent space across all folders (rounded up to 4 KiB). Required when the
  // store is created; 0 on re-open keeps the stored capacity; another value resizes the
  // files (refused if a committed extent would fall outside).
  uint64_t capacity_bytes = 0;
  // On re-open with capacity_bytes 0: the most capacity the stored value may give (0 = no
  // limit), so a manifest cannot make the store preallocate more than the caller would ask
  // for; the committed extents' end is always honoured.
  uint64_t max_capacity_bytes = 0;
  // Stripe size, a multiple of 4 KiB. 0 = 1 MiB for a new store, the stored value on
  // re-open (a different non-zero value is refused: it would change the layout).
  uint64_t stripe_bytes = 0;
  // Create the store when folder 0 has no manifest. false: NotFound instead, and nothing
  // is made in the folders (not even the lock file).
  bool create = true;
  // The identity of the run the store belongs to (opaque bytes, at most 256; e.g. a random
  // run id and the rank). A new store records it in its manifest, and so does one in which
  // nothing was ever committed. With create = false an existing store must record the
  // same, else Open fails with InvalidArgument naming both (a manifest and data files
  // copied from another run or rank); with create = true another run's committed store is
  // opened as it is, for the caller to refuse (Lookup, CommittedStep). Empty: any store is
  // accepted, and keeps the identity it has.
  std::string run_id;
  // With create = false: a store that records this identity instead of run_id is accepted
  // too (the same run written on another rank count: "<run> rank 0 of 2" resumed as "<run>
  // rank 0 of 3"). Its committed manifest keeps the old identity until the next commit,
  // which records run_id (and may record the committed step again: the re-sharded state of
  // that step), so that a crash before it leaves the store as it was; a prepared manifest
  // recording run_id is one of this store's (ResolvePrepared), and the resolve_prepared
  // decider is told that this store committed nothing of the new identity.
  std::string previous_run_id;
  // With create: a store whose committed step is at most this is taken as new (its extents
  // dropped, this run's identity recorded), whoever made it; the engine sets 0 for a fresh
  // run, so that a run that stopped after its initial commit does not block the next one.
  // nullopt: only a store that committed nothing is taken as new.
  std::optional<uint64_t> replace_through_step;
  // Backend made by Open when it is not handed one.
  IoBackendOptions backend;
  // Set by a caller whose commits must agree with other stores' (the ranks of one run; see
  // PrepareCommit). At Open, when folder 0 holds a complete prepared manifest for the step
  // after the committed one (a two-phase commit cut short between its phases), this is
  // asked what to do: true rolls the prepared commit forward (it becomes the committed
  // state), false discards it. Called once at every Open of an existing store, with
  // `prepared` empty when there is none, so every rank takes part in the decision. An error
  // fails the Open. Empty: a prepared manifest is always discarded.
  std::function<Result<bool>(std::optional<uint64_t> committed, std::optional<uint64_t> prepared)>
      resolve_prepared;
  // Test hook, called at named points: "write_submitted" (data of a write queued),
  // "commit_begin", "data_synced", "manifest_temp_written", "manifest_renamed",
  // "committed" (and "prepared" after PrepareCommit, "commit_finishing" before the rename of
  // FinishCommit). Crash tests kill the process from it; the engine sets it from the
  // environment variable STRATA_TEST_KILL_AT (see engine/host_tier.cc). Empty = none.
  std::function<void(std::string_view point)> test_hook;
};

using SwapTicket = uint64_t;

// One operation of a batch (Submit).
struct SwapOp {
  IoOp op = IoOp::kRead;
  std::string key;
  // kWrite: the data (length bytes). kRead: the destination, with room for `length` bytes.
  void* buffer = nullptr;
  // kWrite: bytes to write. kRead: the buffer's capacity; an extent longer than it fails
  // with InvalidArgument.
  uint64_t length = 0;
  // kRead: the committed version, not the newest (NotFound when there is none).
  bool committed = false;
};

struct SwapCompletion {
  SwapTicket ticket = 0;
  IoOp op = IoOp::kRead;
  std::string key;
  uint64_t length = 0;  // bytes of the extent written or read (valid when status is OK)
  Status status;
};

// What the store knows about one key.
struct ExtentInfo {
  uint64_t length = 0;
  uint64_t checksum = 0;   // XXH3-64 of the bytes
  bool committed = false;  // false: written since the last Commit
  uint64_t step = 0;       // the commit that made it durable (when committed)
};

struct SwapPathStats {
  std::string folder;
  std::string data_file;
  uint64_t file_bytes = 0;  // preallocated size
  bool direct = false;      // opened with O_DIRECT (false after the buffered fallback)
  uint64_t bytes_read = 0;  // physical bytes moved to/from this file (4 KiB-padded)
  uint64_t bytes_written = 0;
  uint64_t fs_free_bytes = 0;  // free space left on its file system now
};

struct SwapStoreStats {
  std::string backend;          // the IoBackend's name
  uint64_t capacity_bytes = 0;  // extent space
  uint64_t stripe_bytes = 0;
  uint64_t in_use_bytes = 0;     // allocated: committed + pending + in flight (4 KiB-padded)
  uint64_t committed_bytes = 0;  // allocated to committed versions
  uint64_t largest_free_bytes = 0;
  uint64_t bytes_read = 0;     // logical bytes returned by completed reads
  uint64_t bytes_written = 0;  // logical bytes of completed writes
  uint64_t reads = 0, writes = 0, commits = 0;
  uint64_t extents = 0;  // visible keys
  std::optional<uint64_t> committed_step;
  std::vector<SwapPathStats> paths;
};

class SwapStore {
 public:
  // Opens the store in options.paths, or creates it (see SwapStoreOptions). Uses `backend`
  // when given (e.g. a FaultInjectionBackend), else CreateIoBackend(options.backend).
  // Every check happens before any data is written: a missing folder (NotFound), one that is
  // not a folder or not writable (InvalidArgument), too little free space for the files
  // (NoSpace naming the folder, its free bytes and the bytes needed), a store in use by
  // another process (IOError), a damaged manifest or data file (Corruption).
  static Result<std::unique_ptr<SwapStore>> Open(const SwapStoreOptions& options,
                                                 std::unique_ptr<IoBackend> backend = nullptr);
  // The step of the last commit of the store whose first folder is `folder`, read from its
  // manifest without opening or locking the store; nullopt before the first commit.
  // NotFound without a manifest (a link or non-regular file there: InvalidArgument), Corruption
  // when it does not decode.
  static Result<std::optional<uint64_t>> PeekCommittedStep(const std::string& folder);
  // What folder 0 of a store holds, read without opening (locking) it: the committed
  // manifest's step and run identity and, when a two-phase commit was cut short between its
  // phases, the prepared manifest's (complete and sealed; anything less is none). NotFound
  // when there is no manifest.
  struct Peek {
    std::optional<uint64_t> step;
    std::string run_id;
    std::optional<uint64_t> prepared_step;
    std::string prepared_run_id;
  };
  static Result<Peek> PeekManifests(const std::string& folder);
  // The files of the committed state in folder `index` of a store over `folders` folders:
  // folder 0's manifest, then the folder's data file. With the store closed, these files of
  // every folder are the whole run; nothing else in a folder is the store's state (its lock,
  // its stripe marker, which an open remakes where a copied folder has none, a manifest's
  // temporary, the engine's activation scratch files, the user's own files).
  static std::vector<std::string> StateFileNames(size_t index, size_t folders);
  // Waits for the I/O in flight; does not commit.
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // --- asynchronous ---
  // Queues a write of `length` bytes from `data` as the new version of `key`. The checksum
  // is taken now; keep `data` unchanged until the completion.
  Result<SwapTicket> SubmitWrite(std::string_view key, const void* data, uint64_t length);
  // Queues a read of the newest version of `key` into `buffer` (room for `capacity` bytes).
  Result<SwapTicket> SubmitRead(std::string_view key, void* buffer, uint64_t capacity);
  // Queues a batch with one backend submission; tickets[i] is ops[i]'s. On InvalidArgument
  // (checked for every op first) nothing is queued.
  Result<std::vector<SwapTicket>> Submit(std::span<const SwapOp> ops);
  // Waits until `min_complete` completions are ready (fewer when fewer are outstanding),
  // then moves up to out.size() of them into `out`; returns how many. Fails only when the
  // backend itself fails.
  Result<size_t> Poll(std::span<SwapCompletion> out, size_t min_complete);
  // Waits for `ticket` and returns its status (its completion is consumed; others stay
  // for Poll). InvalidArgument for an unknown or already returned ticket.
  Status Wait(SwapTicket ticket);
  // Tickets submitted and not yet returned by Poll or Wait.
  size_t Outstanding() const;

  // --- synchronous ---
  Status Write(std::string_view key, const void* data, uint64_t length);
  // Returns the extent's length.
  Result<uint64_t> Read(std::string_view key, void* buffer, uint64_t capacity);
  // Reads the committed version of `key` (the one a crash would come back to), even when a
  // newer one was written since; NotFound when the key has no committed version.
  Result<uint64_t> ReadCommitted(std::string_view key, void* buffer, uint64_t capacity);
  // Removes `key` from the next Commit on; reads fail with NotFound from now on. NotFound
  // when the key does not exist.
  Status Delete(std::string_view key);
  // Forgets what was written to or deleted from `key` since the last Commit: the committed
  // version (or none) is visible again and the pending version's space is free. Writes of
  // the key in flight must have completed.
  void Revert(std::string_view key);
  // Makes every completed write and delete durable as step `step` (see the top comment).
  // Waits for the I/O in flight first (their completions stay for Poll). InvalidArgument
  // when `step` is not greater than the last committed step. On failure the last committed
  // state on disk is unchanged and the pending writes stay pending. Do not retry after a
  // failed data sync: Linux may drop the dirty pages of a failed fdatasync and report
  // success on the next one, so the retried commit could name bytes that never reached the
  // disk. Treat a failed Commit as the end of the run (the engine does) and resume from the
  // last commit.
  Status Commit(uint64_t step);
  // Commit in two phases, for stores that must commit together (one per rank): Prepare
  // does everything up to a complete, durable manifest of `step` beside the committed one
  // (data synced, the manifest written under a temporary name and synced with its folder);
  // FinishCommit makes it the committed state (rename, folder sync). A caller commits
  // everywhere with Prepare on every store, a barrier, then Finish on every store: after
  // a crash, each store holds step k committed, or k-1 committed with k prepared, for one
  // k, and SwapStoreOptions::resolve_prepared lets every store roll forward to k. Nothing
  // may be written between the two phases.
  Status PrepareCommit(uint64_t step);
  Status FinishCommit();

  // --- metadata ---
  std::optional<ExtentInfo> Lookup(std::string_view key) const;
  std::vector<std::string> Keys() const;  // visible keys, sorted
  std::optional<uint64_t> CommittedStep() const;
  // The run identity the store records (its manifest's): options.run_id, or, for another
  // run's committed store opened with create (for the caller to refuse), that run's.
  const std::string& RunId() const { return run_id_; }
  SwapStoreStats Stats() const;

  // Registers memory (e.g. the PinnedPool's arena) with the store's backend.
  Status RegisterBuffers(std::span<const BufferRegion> regions);

 private:
  struct Op;
  struct PathState;

  explicit SwapStore(const SwapStoreOptions& options);
  Status Init(std::unique_ptr<IoBackend> backend);
  void Hook(std::string_view point) const;

  std::string DescribeLocation(const swap_internal::ExtentVersion& v) const;

  // I/O (io_mu_ held).
  Result<std::vector<SwapTicket>> SubmitInternal(std::span<const SwapOp> ops, bool sync);
  Result<SwapTicket> SubmitOneLocked(const SwapOp& op, std::vector<IoRequest>* requests);
  Result<SwapCompletion> WaitLocked(SwapTicket ticket);
  Result<uint64_t> ReadVersion(const SwapOp& op);  // Read and ReadCommitted
  Status ProcessCompletions(size_t min_complete);
  void FinishOp(std::unique_ptr<Op> op);
  std::function<Result<bool>(std::optional<uint64_t>, std::optional<uint64_t>)> ResolveDecider()
      const;
  Status CheckRunId(const swap_internal::Manifest& manifest, const std::string& manifest_path);
  // Writes the stripe marker of every folder i where !current[i] (missing, or naming
  // another store or place).
  Status WriteMarkers(const std::vector<bool>& current);
  Status WriteManifest(const swap_internal::Manifest& manifest);
  // The two halves of WriteManifest: the temporary file written and synced (and its
  // folder, with `sync_folder`), then renamed over the manifest and the folder synced.
  Status WriteManifestTemp(const swap_internal::Manifest& manifest, bool sync_folder);
  Status RenameManifestTemp();
  // Commit's phases (io_mu_ held).
  Status PrepareLocked(uint64_t step, bool sync_folder);
  Status FinishLocked();

  const SwapStoreOptions options_;
  std::string run_id_;       // the store's run identity (set by Init; the manifests carry it)
  std::string next_run_id_;  // options_.run_id, adopted from previous_run_id at the next commit
  std::string store_id_;     // the store's own identity (its folders' stripe markers carry it)
  swap_internal::SwapLayout layout_;  // the geometry, fixed at Open

  std::unique_ptr<swap_internal::SwapFolders> folders_;  // descriptors, locks, manifest files
  mutable std::mutex io_mu_;                             // serialises backend use; taken before mu_
  std::unique_ptr<IoBackend> backend_;
  std::string backend_name_;
  std::unordered_map<SwapTicket, std::unique_ptr<Op>> ops_;  // in flight
  std::deque<SwapCompletion> ready_;                         // finished, not yet returned
  // Tickets of synchronous Write/Read calls (in ops_ or ready_): Poll leaves them to their
  // caller, so Poll in one thread and Write/Read in another do not steal each other's.
  std::unordered_set<SwapTicket> sync_tickets_;
  SwapTicket next_ticket_ = 1;

  mutable std::mutex mu_;  // metadata: the table, the paths' byte counts, the counters
  std::vector<std::unique_ptr<PathState>> paths_;
  swap_internal::ExtentTable table_;  // versions, free space, committed and prepared steps
  uint64_t bytes_read_ = 0, bytes_written_ = 0, reads_ = 0, writes_ = 0, commits_ = 0;
};

}  // namespace strata
