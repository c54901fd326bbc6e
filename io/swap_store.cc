// SwapStore implementation.
//
// Metadata. table_ (ExtentTable, io/extent_table.h) holds every key's committed and pending
// versions, the free ranges of the logical space and when a range may be reused; the store
// asks it where a write goes and what a read reads, and tells it when they finish.
//
// I/O. Each operation (Op) becomes one IoRequest per stripe piece of its 4 KiB-aligned
// part, plus one for its partial last block, which goes through a private 4 KiB bounce
// block (zero-padded for writes, copied out for reads) so callers never need room beyond
// their length. All requests of a Submit go to the backend in one call; completions carry
// the ticket as user_data and an Op finishes when its last piece completes. Short
// transfers and EAGAIN are the backend's business: a completion is all-or-nothing.
//
// Locks. io_mu_ serialises everything that touches the backend or ops_/ready_; mu_ guards
// the metadata and is never held across a blocking backend call. Order: io_mu_, then mu_.
#include "io/swap_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "io/manifest.h"
#include "io/stripe_marker.h"
#include "io/swap_folders.h"
#include "io/swap_layout.h"
#include "strata/bytes.h"
#include "strata/log.h"

namespace strata {

using swap_internal::Checksum64;
using swap_internal::ExtentVersion;
using swap_internal::Manifest;
using swap_internal::VersionPtr;

namespace {

constexpr uint64_t kBlock = kIoAlignment;

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBlock = std::unique_ptr<char, AlignedFree>;

Status ValidateBuffer(std::string_view key, const void* buffer, uint64_t length) {
  if (key.empty()) return Status::InvalidArgument("swap store: empty extent key");
  if (length == 0) return Status::OK();
  if (buffer == nullptr) {
    return Status::InvalidArgument("swap store: null buffer for extent '" + std::string(key) +
                                   "' of " + std::to_string(length) + " bytes");
  }
  if (reinterpret_cast<uintptr_t>(buffer) % kIoAlignment != 0) {
    return Status::InvalidArgument(
        "swap store: buffer for extent '" + std::string(key) + "' is not " +
        std::to_string(kIoAlignment) +
        "-byte aligned (O_DIRECT needs it); allocate swap buffers from the PinnedPool");
  }
  return Status::OK();
}

}  // namespace

struct SwapStore::Op {
  SwapTicket ticket = 0;
  IoOp kind = IoOp::kRead;
  std::string key;
  VersionPtr version;
  char* buffer = nullptr;
  uint64_t length = 0;
  uint64_t seq = 0;
  size_t remaining = 0;  // requests not yet completed
  Status status;
  AlignedBlock tail;      // bounce block for the partial last block
  uint64_t tail_pos = 0;  // where the partial block starts in buffer
  std::vector<swap_internal::SwapChunk> chunks;
};

// One data file's I/O state (its name and folder are folders_'s).
struct SwapStore::PathState {
  int handle = -1;
  bool direct = false;
  uint64_t bytes_read = 0;  // guarded by mu_
  uint64_t bytes_written = 0;
};

SwapStore::SwapStore(const SwapStoreOptions& options) : options_(options) {}

Result<std::optional<uint64_t>> SwapStore::PeekCommittedStep(const std::string& folder) {
  return swap_internal::SwapFolders::PeekCommittedStep(folder);
}

Result<SwapStore::Peek> SwapStore::PeekManifests(const std::string& folder) {
  Peek p;
  const std::string path = swap_internal::JoinPath(folder, "strata.manifest");
  // Read once: the step and the identity come from the same manifest.
  STRATA_ASSIGN_OR_RETURN(const swap_internal::Manifest m,
                          swap_internal::SwapFolders::PeekManifest(folder));
  p.step = m.step;
  p.run_id = m.run_id;
  if (auto tmp = swap_internal::SwapFolders::PeekTemporary(folder)) {
    // A torn prepared manifest is none (a commit cut short before it was complete).
    auto prepared = swap_internal::DecodeManifest(*tmp, path + ".tmp");
    if (prepared.ok() && prepared->step) {
      p.prepared_step = prepared->step;
      p.prepared_run_id = prepared->run_id;
    }
  }
  return p;
}

std::vector<std::string> SwapStore::StateFileNames(size_t index, size_t folders) {
  return swap_internal::SwapFolders::StateFileNames(index, folders);
}

Result<std::unique_ptr<SwapStore>> SwapStore::Open(const SwapStoreOptions& options,
                                                   std::unique_ptr<IoBackend> backend) {
  std::unique_ptr<SwapStore> store(new SwapStore(options));
  STRATA_RETURN_IF_ERROR(store->Init(std::move(backend)));
  return store;
}

// The caller's decider; a store still under its previous identity (previous_run_id) has
// committed nothing of this one, and says so: its peers that finished the first commit under
// the new identity then make it roll its prepared one forward (engine/rank_commit.h).
swap_internal::SwapFolders::Decider SwapStore::ResolveDecider() const {
  if (next_run_id_.empty()) return options_.resolve_prepared;
  return [decide = options_.resolve_prepared](std::optional<uint64_t>,
                                              std::optional<uint64_t> prepared) {
    return decide(std::nullopt, prepared);
  };
}

void SwapStore::Hook(std::string_view point) const {
  if (options_.test_hook) options_.test_hook(point);
}

// A store made by another run (or rank) is refused; a caller that names no run adopts the
// store's, so that its commits keep it.
Status SwapStore::CheckRunId(const Manifest& manifest, const std::string& manifest_path) {
  run_id_ = manifest.run_id;
  if (options_.run_id.empty() || manifest.run_id == options_.run_id) return Status::OK();
  if (!options_.previous_run_id.empty() && manifest.run_id == options_.previous_run_id) {
    next_run_id_ = options_.run_id;  // recorded by the first commit, not before
    return Status::OK();
  }
  if (options_.create && !manifest.step && manifest.entries.empty()) {
    // Nothing was ever committed (a run stopped before its first commit): the store is as
    // good as new, and the run creating it now makes it its own.
    run_id_ = options_.run_id;
    return Status::OK();
  }
  // A caller that would create a store and finds another run's committed one decides
  // itself (the engine refuses it, saying how to resume it); its commits keep the store's
  // identity.
  if (options_.create) return Status::OK();
  const std::string stored = manifest.run_id.empty()
                                 ? "no run identity (written by a strata before identities)"
                                 : "run '" + manifest.run_id + "'";
  return Status::InvalidArgument("the swap store in " + options_.paths[0] +
                                 " belongs to another run: its manifest " + manifest_path +
                                 " names " + stored + ", this run is '" + options_.run_id +
                                 "' (the manifest and data files were copied from another run "
                                 "or rank?); resume the folder this run wrote, or start a fresh "
                                 "run in an empty folder")
      .WithPath(manifest_path);
}

Status SwapStore::Init(std::unique_ptr<IoBackend> backend) {
  const size_t n = options_.paths.size();
  if (n == 0) return Status::InvalidArgument("swap store: no swap folder given");
  if (options_.stripe_bytes % kBlock != 0) {
    return Status::InvalidArgument("swap store: stripe size " +
                                   std::to_string(options_.stripe_bytes) +
                                   " is not a multiple of 4096 bytes");
  }
  if (options_.run_id.size() > swap_internal::kMaxRunIdBytes) {
    return Status::InvalidArgument("swap store: run identity of " +
                                   std::to_string(options_.run_id.size()) + " bytes; at most " +
                                   std::to_string(swap_internal::kMaxRunIdBytes));
  }
  const std::string& folder0 = options_.paths[0];
  // Before the folders are locked: the folders must be this store's, in its order (resume),
  // or hold no part of another run's committed store (fresh).
  std::vector<std::optional<swap_internal::StripeMarker>> markers;
  STRATA_RETURN_IF_ERROR(swap_internal::CheckStripeFolders(
      options_.paths, options_.create, options_.replace_through_step, &markers));
  struct stat folder_st {};
  if (!options_.create && ::stat(folder0.c_str(), &folder_st) == 0 &&
      !swap_internal::SwapFolders::HasManifest(folder0)) {
    // Before the folders are locked: a folder refused here is left as it was.
    return Status::NotFound("no swap store in " + folder0 + " (no " +
                            swap_internal::JoinPath(folder0, "strata.manifest") +
                            "); start a fresh run there (without --resume)")
        .WithPath(folder0);
  }
  STRATA_ASSIGN_OR_RETURN(folders_, swap_internal::SwapFolders::Open(options_.paths));
  const std::string& manifest_path = folders_->manifest_path();
  for (size_t i = 0; i < n; ++i) paths_.push_back(std::make_unique<PathState>());

  // The manifest, when there is one, fixes the geometry.
  STRATA_ASSIGN_OR_RETURN(std::optional<Manifest> manifest, folders_->ReadManifest());
  if (!manifest && !options_.create) {
    return Status::NotFound("no swap store in " + folder0 + " (no " + manifest_path +
                            "); start a fresh run there (without --resume)")
        .WithPath(manifest_path);
  }
  if (manifest && options_.create && manifest->step && options_.replace_through_step &&
      *manifest->step <= *options_.replace_through_step) {
    LogDebug("swap store in " + folder0 + ": its run committed nothing after step " +
             std::to_string(*manifest->step) + "; a fresh store takes its place");
    manifest.reset();
  }
  if (manifest) STRATA_RETURN_IF_ERROR(CheckRunId(*manifest, manifest_path));
  if (manifest && options_.resolve_prepared) {
    STRATA_ASSIGN_OR_RETURN(
        manifest, folders_->ResolvePrepared(std::move(*manifest), ResolveDecider(), next_run_id_));
    if (manifest->run_id == next_run_id_) {  // the prepared commit rolled forward
      run_id_ = next_run_id_;
      next_run_id_.clear();
    }
  }
  folders_->RemoveTemporary();  // a Commit cut short: discarded

  // A new store gets a new identity; an existing one keeps its folder 0's (a store made
  // before markers gets one now).
  std::vector<bool> current(n, false);
  if (manifest && markers[0]) {
    store_id_ = markers[0]->store_id;
    for (size_t i = 0; i < n; ++i) {
      current[i] = markers[i] && markers[i]->store_id == store_id_ && markers[i]->index == i &&
                   markers[i]->count == n;
    }
  } else {
    store_id_ = swap_internal::NewStoreId();
  }
  STRATA_ASSIGN_OR_RETURN(layout_, swap_internal::SwapLayout::Resolve(
                                       options_, manifest ? &*manifest : nullptr, n, folder0));
  // Existing data files must cover every committed extent ("swap files that come back
  // short" are caught here, not as checksum errors later).
  const std::vector<uint64_t> needed_end =
      manifest ? layout_.NeededEnds(*manifest) : std::vector<uint64_t>(n, 0);
  STRATA_RETURN_IF_ERROR(folders_->CheckDataFiles(
      needed_end, manifest && !manifest->entries.empty(), layout_.file_bytes, layout_.capacity));

  STRATA_RETURN_IF_ERROR(WriteMarkers(current));
  if (backend) {
    backend_ = std::move(backend);
  } else {
    STRATA_ASSIGN_OR_RETURN(backend_, CreateIoBackend(options_.backend));
  }
  backend_name_ = std::string(backend_->Name());
  for (size_t i = 0; i < n; ++i) {
    PathState& ps = *paths_[i];
    STRATA_ASSIGN_OR_RETURN(ps.handle,
                            folders_->OpenDataFile(*backend_, i, options_.backend.direct));
    ps.direct = backend_->IsDirect(ps.handle);
    Status s = backend_->Allocate(ps.handle, layout_.file_bytes);
    if (!s.ok()) {
      return s.Annotate("preallocating swap file " + folders_->data_file(i) + " (" +
                        FormatBytesExact(layout_.file_bytes) + ")");
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  table_.Reset(layout_.capacity);
  if (manifest) {
    STRATA_RETURN_IF_ERROR(table_.Load(*manifest, manifest_path));
    if (manifest->run_id != run_id_) {  // adopted by a new run (CheckRunId)
      manifest->run_id = run_id_;
      STRATA_RETURN_IF_ERROR(WriteManifest(*manifest));
    }
  } else {
    // A new store: an empty manifest makes the next Open find it.
    Manifest m;
    run_id_ = options_.run_id;
    m.run_id = run_id_;
    m.num_paths = static_cast<uint32_t>(n);
    m.stripe_bytes = layout_.stripe;
    m.capacity_bytes = layout_.capacity;
    STRATA_RETURN_IF_ERROR(WriteManifest(m));
  }
  return Status::OK();
}

Status SwapStore::WriteMarkers(const std::vector<bool>& current) {
  const std::string& run = options_.run_id.empty() ? run_id_ : options_.run_id;
  for (size_t i = 0; i < current.size(); ++i) {
    if (current[i]) continue;
    STRATA_RETURN_IF_ERROR(swap_internal::WriteStripeMarker(
        folders_->dir_fd(i), folders_->folder(i),
        swap_internal::MakeStripeMarker(store_id_, run, uint32_t(i), options_.paths)));
  }
  return Status::OK();
}

SwapStore::~SwapStore() {
  {
    std::lock_guard<std::mutex> lock(io_mu_);
    while (backend_ && !ops_.empty() && backend_->InFlight() > 0) {
      if (!ProcessCompletions(1).ok()) break;
    }
    if (backend_) {
      for (auto& ps : paths_) {
        if (ps->handle >= 0) (void)backend_->CloseFile(ps->handle);
      }
    }
    // The backend waits for anything still in flight (after a backend failure) before the
    // operations' bounce blocks go away with ops_.
    backend_.reset();
  }
  folders_.reset();  // the folders' descriptors and locks, after every file is closed
}

std::string SwapStore::DescribeLocation(const ExtentVersion& v) const {
  std::vector<swap_internal::SwapChunk> chunks;
  layout_.Map(v.offset, v.alloc, &chunks);
  std::string s;
  for (size_t i = 0; i < chunks.size() && i < 4; ++i) {
    s += (i ? ", " : "") + folders_->data_file(chunks[i].path) + " offset " +
         std::to_string(chunks[i].file_offset) + " (" + std::to_string(chunks[i].length) +
         " bytes)";
  }
  if (chunks.size() > 4) s += " and " + std::to_string(chunks.size() - 4) + " more pieces";
  return s;
}

Result<SwapTicket> SwapStore::SubmitOneLocked(const SwapOp& sop, std::vector<IoRequest>* requests) {
  auto op = std::make_unique<Op>();
  op->ticket = next_ticket_++;
  op->kind = sop.op;
  op->key = sop.key;
  op->buffer = static_cast<char*>(sop.buffer);
  const SwapTicket ticket = op->ticket;

  if (sop.op == IoOp::kWrite) {
    op->length = sop.length;
    const uint64_t sum = Checksum64(sop.buffer, sop.length);
    std::lock_guard<std::mutex> lock(mu_);
    Result<VersionPtr> v = table_.NewVersion(sop.key, sop.length, sum);
    if (!v.ok()) {
      ready_.push_back(SwapCompletion{ticket, op->kind, op->key, 0, v.status()});
      return ticket;
    }
    op->seq = table_.NextSeq();
    op->version = std::move(*v);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    Result<VersionPtr> v = table_.BeginRead(sop.key, sop.committed, sop.length);
    if (!v.ok()) {
      ready_.push_back(SwapCompletion{ticket, op->kind, op->key, 0, v.status()});
      return ticket;
    }
    op->length = (*v)->length;
    op->version = std::move(*v);
  }

  // Requests: whole blocks straight from/to the caller's buffer, the partial tail block
  // through the bounce block.
  const ExtentVersion& v = *op->version;
  const uint64_t whole = op->length / kBlock * kBlock;
  const IoOp kind = op->kind;
  auto add = [&](uint64_t logical, uint64_t len, char* buf) {
    size_t first = op->chunks.size();
    layout_.Map(logical, len, &op->chunks);
    uint64_t pos = 0;
    for (size_t i = first; i < op->chunks.size(); ++i) {
      const swap_internal::SwapChunk& c = op->chunks[i];
      requests->push_back(
          IoRequest{kind, paths_[c.path]->handle, c.file_offset, buf + pos, c.length, ticket});
      pos += c.length;
      ++op->remaining;
    }
  };
  if (whole > 0) add(v.offset, whole, op->buffer);
  if (op->length > whole) {
    op->tail.reset(static_cast<char*>(std::aligned_alloc(kBlock, kBlock)));
    op->tail_pos = whole;
    if (kind == IoOp::kWrite) {
      std::memcpy(op->tail.get(), op->buffer + whole, op->length - whole);
      std::memset(op->tail.get() + (op->length - whole), 0, kBlock - (op->length - whole));
    }
    add(v.offset + whole, kBlock, op->tail.get());
  }
  if (op->remaining == 0) {
    FinishOp(std::move(op));  // 0 bytes: nothing to move
  } else {
    ops_.emplace(ticket, std::move(op));
  }
  return ticket;
}

Result<std::vector<SwapTicket>> SwapStore::Submit(std::span<const SwapOp> ops) {
  return SubmitInternal(ops, /*sync=*/false);
}

Result<std::vector<SwapTicket>> SwapStore::SubmitInternal(std::span<const SwapOp> ops, bool sync) {
  for (const SwapOp& op : ops) STRATA_RETURN_IF_ERROR(ValidateBuffer(op.key, op.buffer, op.length));
  std::lock_guard<std::mutex> lock(io_mu_);
  std::vector<IoRequest> requests;
  std::vector<SwapTicket> tickets;
  tickets.reserve(ops.size());
  for (const SwapOp& op : ops) {
    STRATA_ASSIGN_OR_RETURN(SwapTicket t, SubmitOneLocked(op, &requests));
    tickets.push_back(t);
    if (sync) sync_tickets_.insert(t);
  }
  if (requests.empty()) return tickets;
  bool has_write =
      std::any_of(ops.begin(), ops.end(), [](const SwapOp& o) { return o.op == IoOp::kWrite; });
  const size_t in_flight_before = backend_->InFlight();
  Status s = backend_->Submit(requests);
  if (!s.ok()) {
    // The batch's operations fail with the backend's status. When the backend queued
    // nothing (it refused the batch up front) they finish now; when it queued the requests
    // but could not hand them to the kernel, they finish as their completions arrive, so
    // no buffer or extent is released while the kernel may still use it.
    const bool queued = backend_->InFlight() > in_flight_before;
    for (SwapTicket t : tickets) {
      auto it = ops_.find(t);
      if (it == ops_.end()) continue;
      it->second->status = s;
      if (queued) continue;
      std::unique_ptr<Op> op = std::move(it->second);
      ops_.erase(it);
      FinishOp(std::move(op));
    }
    return tickets;
  }
  if (has_write) Hook("write_submitted");
  return tickets;
}

Result<SwapTicket> SwapStore::SubmitWrite(std::string_view key, const void* data, uint64_t length) {
  SwapOp op{IoOp::kWrite, std::string(key), const_cast<void*>(data), length};
  STRATA_ASSIGN_OR_RETURN(std::vector<SwapTicket> t, Submit(std::span<const SwapOp>(&op, 1)));
  return t[0];
}

Result<SwapTicket> SwapStore::SubmitRead(std::string_view key, void* buffer, uint64_t capacity) {
  SwapOp op{IoOp::kRead, std::string(key), buffer, capacity};
  STRATA_ASSIGN_OR_RETURN(std::vector<SwapTicket> t, Submit(std::span<const SwapOp>(&op, 1)));
  return t[0];
}

Status SwapStore::ProcessCompletions(size_t min_complete) {
  IoCompletion done[64];
  if (backend_->InFlight() == 0) {
    if (ops_.empty()) return Status::OK();
    return Status::IOError("swap store: " + std::to_string(ops_.size()) +
                           " operation(s) wait for completions the backend does not have");
  }
  STRATA_ASSIGN_OR_RETURN(size_t got, backend_->Poll(done, std::min<size_t>(min_complete, 64)));
  for (size_t i = 0; i < got; ++i) {
    auto it = ops_.find(done[i].user_data);
    if (it == ops_.end()) continue;
    Op& op = *it->second;
    if (!done[i].status.ok() && op.status.ok()) op.status = done[i].status;
    if (--op.remaining == 0) {
      std::unique_ptr<Op> finished = std::move(it->second);
      ops_.erase(it);
      FinishOp(std::move(finished));
    }
  }
  return Status::OK();
}

void SwapStore::FinishOp(std::unique_ptr<Op> op) {
  const ExtentVersion& v = *op->version;
  if (op->kind == IoOp::kRead) {
    if (op->status.ok() && op->tail) {
      std::memcpy(op->buffer + op->tail_pos, op->tail.get(), op->length - op->tail_pos);
    }
    if (op->status.ok()) {
      uint64_t got = Checksum64(op->buffer, op->length);
      if (got != v.checksum) {
        std::vector<swap_internal::SwapChunk> first;
        layout_.Map(v.offset, std::min<uint64_t>(v.alloc, kBlock), &first);
        op->status =
            Status::Corruption("checksum mismatch in extent '" + op->key + "' (" +
                               std::to_string(v.length) + " bytes, " +
                               (v.committed ? "committed at step " + std::to_string(v.step)
                                            : std::string("uncommitted")) +
                               "): stored XXH3 " + Hex(v.checksum) + ", read " + Hex(got) +
                               "; its data lies at " + DescribeLocation(v) +
                               ". The drive or file was damaged; restore from a checkpoint")
                .WithPath(folders_->data_file(first[0].path))
                .WithOffset(first[0].file_offset);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (op->kind == IoOp::kRead) {
      table_.EndRead(op->version);
      if (op->status.ok()) {
        ++reads_;
        bytes_read_ += op->length;
        for (const swap_internal::SwapChunk& c : op->chunks) paths_[c.path]->bytes_read += c.length;
      }
    } else if (op->status.ok()) {
      ++writes_;
      bytes_written_ += op->length;
      for (const swap_internal::SwapChunk& c : op->chunks)
        paths_[c.path]->bytes_written += c.length;
      table_.WriteCompleted(op->key, op->version, op->seq);
    } else {
      table_.WriteFailed(op->version);
    }
  }
  ready_.push_back(SwapCompletion{op->ticket, op->kind, std::move(op->key),
                                  op->status.ok() ? op->length : 0, std::move(op->status)});
}

Result<size_t> SwapStore::Poll(std::span<SwapCompletion> out, size_t min_complete) {
  std::lock_guard<std::mutex> lock(io_mu_);
  // Completions of synchronous calls belong to the thread waiting in them: never handed out.
  auto ready_async = [&] {
    size_t n = 0;
    for (const SwapCompletion& c : ready_) n += sync_tickets_.count(c.ticket) ? 0 : 1;
    return n;
  };
  const size_t want = std::min(min_complete, ready_.size() + ops_.size() - sync_tickets_.size());
  while (ready_async() < want) STRATA_RETURN_IF_ERROR(ProcessCompletions(1));
  if (ready_async() < out.size() && !ops_.empty()) {
    STRATA_RETURN_IF_ERROR(ProcessCompletions(0));  // pick up what is already done
  }
  size_t n = 0;
  for (auto it = ready_.begin(); it != ready_.end() && n < out.size();) {
    if (sync_tickets_.count(it->ticket)) {
      ++it;
      continue;
    }
    out[n++] = std::move(*it);
    it = ready_.erase(it);
  }
  return n;
}

Result<SwapCompletion> SwapStore::WaitLocked(SwapTicket ticket) {
  while (true) {
    for (auto it = ready_.begin(); it != ready_.end(); ++it) {
      if (it->ticket == ticket) {
        SwapCompletion c = std::move(*it);
        ready_.erase(it);
        sync_tickets_.erase(ticket);
        return c;
      }
    }
    if (ops_.find(ticket) == ops_.end()) {
      return Status::InvalidArgument("swap store: unknown ticket " + std::to_string(ticket) +
                                     " (never submitted or already returned)");
    }
    STRATA_RETURN_IF_ERROR(ProcessCompletions(1));
  }
}

Status SwapStore::Wait(SwapTicket ticket) {
  std::lock_guard<std::mutex> lock(io_mu_);
  if (sync_tickets_.count(ticket)) {
    return Status::InvalidArgument("swap store: ticket " + std::to_string(ticket) +
                                   " belongs to a synchronous call in another thread");
  }
  STRATA_ASSIGN_OR_RETURN(SwapCompletion c, WaitLocked(ticket));
  return std::move(c.status);
}

size_t SwapStore::Outstanding() const {
  std::lock_guard<std::mutex> lock(io_mu_);
  return ops_.size() + ready_.size() - sync_tickets_.size();
}

Status SwapStore::Write(std::string_view key, const void* data, uint64_t length) {
  SwapOp op{IoOp::kWrite, std::string(key), const_cast<void*>(data), length};
  STRATA_ASSIGN_OR_RETURN(std::vector<SwapTicket> t,
                          SubmitInternal(std::span<const SwapOp>(&op, 1), /*sync=*/true));
  std::lock_guard<std::mutex> lock(io_mu_);
  STRATA_ASSIGN_OR_RETURN(SwapCompletion c, WaitLocked(t[0]));
  return std::move(c.status);
}

Result<uint64_t> SwapStore::Read(std::string_view key, void* buffer, uint64_t capacity) {
  return ReadVersion(SwapOp{IoOp::kRead, std::string(key), buffer, capacity});
}

Result<uint64_t> SwapStore::ReadCommitted(std::string_view key, void* buffer, uint64_t capacity) {
  return ReadVersion(SwapOp{IoOp::kRead, std::string(key), buffer, capacity, /*committed=*/true});
}

Result<uint64_t> SwapStore::ReadVersion(const SwapOp& op) {
  STRATA_ASSIGN_OR_RETURN(std::vector<SwapTicket> t,
                          SubmitInternal(std::span<const SwapOp>(&op, 1), /*sync=*/true));
  std::lock_guard<std::mutex> lock(io_mu_);
  STRATA_ASSIGN_OR_RETURN(SwapCompletion c, WaitLocked(t[0]));
  if (!c.status.ok()) return std::move(c.status);
  return c.length;
}

Status SwapStore::Delete(std::string_view key) {
  std::lock_guard<std::mutex> io_lock(io_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  return table_.Delete(key);
}

void SwapStore::Revert(std::string_view key) {
  std::lock_guard<std::mutex> io_lock(io_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  table_.Revert(key);
}

Status SwapStore::WriteManifest(const Manifest& manifest) {
  STRATA_RETURN_IF_ERROR(WriteManifestTemp(manifest, /*sync_folder=*/false));
  return RenameManifestTemp();
}

Status SwapStore::WriteManifestTemp(const Manifest& manifest, bool sync_folder) {
  STRATA_RETURN_IF_ERROR(
      folders_->WriteTemporary(swap_internal::EncodeManifest(manifest), sync_folder));
  Hook("manifest_temp_written");
  return Status::OK();
}

Status SwapStore::RenameManifestTemp() {
  STRATA_RETURN_IF_ERROR(folders_->RenameTemporary());
  Hook("manifest_renamed");
  return Status::OK();
}

Status SwapStore::Commit(uint64_t step) {
  std::lock_guard<std::mutex> io_lock(io_mu_);
  STRATA_RETURN_IF_ERROR(PrepareLocked(step, /*sync_folder=*/false));
  return FinishLocked();
}

Status SwapStore::PrepareCommit(uint64_t step) {
  std::lock_guard<std::mutex> io_lock(io_mu_);
  STRATA_RETURN_IF_ERROR(PrepareLocked(step, /*sync_folder=*/true));
  Hook("prepared");
  return Status::OK();
}

Status SwapStore::FinishCommit() {
  std::lock_guard<std::mutex> io_lock(io_mu_);
  return FinishLocked();
}

Status SwapStore::PrepareLocked(uint64_t step, bool sync_folder) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    STRATA_RETURN_IF_ERROR(table_.CheckCanPrepare(step, !next_run_id_.empty()));
  }
  while (!ops_.empty()) STRATA_RETURN_IF_ERROR(ProcessCompletions(ops_.size()));
  Hook("commit_begin");
  for (auto& ps : paths_) {
    Status s = backend_->Sync(ps->handle);
    if (!s.ok()) return s.Annotate("commit of step " + std::to_string(step));
  }
  Hook("data_synced");

  Manifest m;
  m.run_id = next_run_id_.empty() ? run_id_ : next_run_id_;
  m.num_paths = static_cast<uint32_t>(paths_.size());
  m.stripe_bytes = layout_.stripe;
  m.capacity_bytes = layout_.capacity;
  m.step = step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m.entries = table_.ManifestEntries(step);
  }
  Status s = WriteManifestTemp(m, sync_folder);
  if (!s.ok()) return s.Annotate("commit of step " + std::to_string(step));
  std::lock_guard<std::mutex> lock(mu_);
  table_.MarkPrepared(step);
  return Status::OK();
}

Status SwapStore::FinishLocked() {
  uint64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    STRATA_ASSIGN_OR_RETURN(step, table_.PreparedStep());
  }
  Hook("commit_finishing");
  Status s = RenameManifestTemp();
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    table_.AbortPrepared();
    return s.Annotate("commit of step " + std::to_string(step));
  }

  // The new manifest is durable: the versions it no longer names may be reused.
  std::lock_guard<std::mutex> lock(mu_);
  table_.FinishCommit(step);
  ++commits_;
  if (!next_run_id_.empty()) {
    run_id_ = next_run_id_;
    next_run_id_.clear();
  }
  Hook("committed");
  return Status::OK();
}

std::optional<ExtentInfo> SwapStore::Lookup(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mu_);
  VersionPtr v = table_.Lookup(key);
  if (!v) return std::nullopt;
  return ExtentInfo{v->length, v->checksum, v->committed, v->step};
}

std::vector<std::string> SwapStore::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.Keys();
}

std::optional<uint64_t> SwapStore::CommittedStep() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.committed_step();
}

SwapStoreStats SwapStore::Stats() const {
  SwapStoreStats s;
  s.backend = backend_name_;
  std::lock_guard<std::mutex> lock(mu_);
  s.capacity_bytes = layout_.capacity;
  s.stripe_bytes = layout_.stripe;
  s.in_use_bytes = table_.in_use();
  s.committed_bytes = table_.committed_bytes();
  s.largest_free_bytes = table_.largest_free();
  s.bytes_read = bytes_read_;
  s.bytes_written = bytes_written_;
  s.reads = reads_;
  s.writes = writes_;
  s.commits = commits_;
  s.extents = table_.Extents();
  s.committed_step = table_.committed_step();
  for (size_t i = 0; i < paths_.size(); ++i) {
    const PathState* ps = paths_[i].get();
    SwapPathStats p;
    p.folder = folders_->folder(i);
    p.data_file = folders_->data_file(i);
    p.file_bytes = layout_.file_bytes;
    p.direct = ps->direct;
    p.bytes_read = ps->bytes_read;
    p.bytes_written = ps->bytes_written;
    struct statvfs vfs {};
    if (statvfs(p.folder.c_str(), &vfs) == 0) {
      p.fs_free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    }
    s.paths.push_back(std::move(p));
  }
  return s;
}

Status SwapStore::RegisterBuffers(std::span<const BufferRegion> regions) {
  std::lock_guard<std::mutex> lock(io_mu_);
  return backend_->RegisterBuffers(regions);
}

}  // namespace strata
