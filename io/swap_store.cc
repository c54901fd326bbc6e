// SwapStore implementation.
//
// Metadata. entries_ maps a key to its committed version (what the manifest on disk names)
// and its pending version (completed since the last Commit), or a pending delete. A Version
// is a range of the logical space plus length and checksum. Ranges come from a first-fit
// free map (offset -> length, coalesced) over the logical space.
//
// When space is freed. A version's range returns to the free map once (a) it is no longer
// named by entries_ (superseded pending version, failed or out-raced write, or a committed
// version replaced or deleted by a Commit that has reached the disk) and (b) no read in
// flight still targets it (Version::readers). (b) matters because a read of version A may
// still be in flight when a newer write replaces A; reusing A's space for a third write
// would let the read see foreign bytes. Committed versions are dropped only after the new
// manifest is durable, which is what makes re-opening after a crash safe: every range the
// on-disk manifest names is untouched until a later manifest stops naming it.
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
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "io/manifest.h"
#include "io/swap_folders.h"
#include "strata/bytes.h"
#include "strata/log.h"

namespace strata {

using swap_internal::Checksum64;
using swap_internal::Manifest;
using swap_internal::ManifestEntry;

namespace {

constexpr uint64_t kBlock = kIoAlignment;
constexpr uint64_t kDefaultStripe = 1 << 20;

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

struct SwapStore::Version {
  uint64_t offset = 0;  // logical
  uint64_t length = 0;
  uint64_t alloc = 0;  // RoundUp(length, 4 KiB): the range held
  uint64_t checksum = 0;
  uint64_t step = 0;
  bool committed = false;
  int readers = 0;       // reads in flight
  bool dropped = false;  // no longer named by entries_
  bool freed = false;
};

struct SwapStore::Entry {
  std::shared_ptr<Version> committed;
  std::shared_ptr<Version> pending;
  bool deleted = false;  // pending delete
  uint64_t seq = 0;      // seq_ of the write or delete that set the pending state
};

struct SwapStore::Op {
  SwapTicket ticket = 0;
  IoOp kind = IoOp::kRead;
  std::string key;
  std::shared_ptr<Version> version;
  char* buffer = nullptr;
  uint64_t length = 0;
  uint64_t seq = 0;
  size_t remaining = 0;  // requests not yet completed
  Status status;
  AlignedBlock tail;      // bounce block for the partial last block
  uint64_t tail_pos = 0;  // where the partial block starts in buffer
  std::vector<Chunk> chunks;
};

struct SwapStore::PathState {
  std::string folder;
  std::string file;       // folder + "/" + file_name, for messages
  std::string file_name;  // opened relative to the folder's descriptor (SwapFolders)
  int dir_fd = -1;        // folders_->dir_fd(i), owned by folders_
  int handle = -1;
  bool direct = false;
  uint64_t bytes_read = 0;  // guarded by mu_
  uint64_t bytes_written = 0;
};

SwapStore::SwapStore(const SwapStoreOptions& options) : options_(options) {}

Result<std::unique_ptr<SwapStore>> SwapStore::Open(const SwapStoreOptions& options,
                                                   std::unique_ptr<IoBackend> backend) {
  std::unique_ptr<SwapStore> store(new SwapStore(options));
  STRATA_RETURN_IF_ERROR(store->Init(std::move(backend)));
  return store;
}

void SwapStore::Hook(std::string_view point) const {
  if (options_.test_hook) options_.test_hook(point);
}

Status SwapStore::Init(std::unique_ptr<IoBackend> backend) {
  const size_t n = options_.paths.size();
  if (n == 0) return Status::InvalidArgument("swap store: no swap folder given");
  if (options_.stripe_bytes % kBlock != 0) {
    return Status::InvalidArgument("swap store: stripe size " +
                                   std::to_string(options_.stripe_bytes) +
                                   " is not a multiple of 4096 bytes");
  }
  const std::string& folder0 = options_.paths[0];
  STRATA_ASSIGN_OR_RETURN(folders_, swap_internal::SwapFolders::Open(options_.paths));
  manifest_path_ = folders_->manifest_path();
  for (size_t i = 0; i < n; ++i) {
    auto ps = std::make_unique<PathState>();
    ps->folder = options_.paths[i];
    ps->file_name = "strata.swap." + std::to_string(i) + "-of-" + std::to_string(n);
    ps->file = swap_internal::JoinPath(ps->folder, ps->file_name);
    ps->dir_fd = folders_->dir_fd(i);
    paths_.push_back(std::move(ps));
  }

  // The manifest, when there is one, fixes the geometry.
  std::optional<Manifest> manifest;
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> bytes, folders_->ReadManifest());
  if (bytes) {
    STRATA_ASSIGN_OR_RETURN(Manifest m, swap_internal::DecodeManifest(*bytes, manifest_path_));
    manifest = std::move(m);
  } else if (!options_.create) {
    return Status::NotFound("no swap store in " + folder0 + " (no " + manifest_path_ +
                            "); start a fresh run there (without --resume)")
        .WithPath(manifest_path_);
  }
  if (manifest && options_.resolve_prepared) {
    STRATA_ASSIGN_OR_RETURN(manifest, ResolvePrepared(std::move(*manifest)));
  }
  folders_->RemoveTemporary();  // a Commit cut short: discarded

  if (manifest) {
    if (manifest->num_paths != n) {
      return Status::InvalidArgument("swap store in " + folder0 + " was created over " +
                                     std::to_string(manifest->num_paths) + " folder(s) but " +
                                     std::to_string(n) +
                                     " were given; give the same folders in the same order");
    }
    if (options_.stripe_bytes != 0 && options_.stripe_bytes != manifest->stripe_bytes) {
      return Status::InvalidArgument("swap store in " + folder0 + " uses a stripe of " +
                                     std::to_string(manifest->stripe_bytes) + " bytes, not " +
                                     std::to_string(options_.stripe_bytes) +
                                     "; pass 0 to keep the stored stripe");
    }
    stripe_ = manifest->stripe_bytes;
    capacity_ = options_.capacity_bytes ? RoundUp(options_.capacity_bytes, kBlock)
                                        : manifest->capacity_bytes;
    if (options_.capacity_bytes == 0 && options_.max_capacity_bytes != 0) {
      // The stored capacity is only trusted up to what the caller allows, and never below
      // what the committed extents need.
      uint64_t committed_end = 0;
      for (const ManifestEntry& e : manifest->entries) {
        if (e.offset > capacity_ || RoundUp(e.length, kBlock) > capacity_ - e.offset) continue;
        committed_end = std::max(committed_end, e.offset + RoundUp(e.length, kBlock));
      }
      capacity_ = std::min(capacity_,
                           std::max(RoundUp(options_.max_capacity_bytes, kBlock), committed_end));
    }
    for (const ManifestEntry& e : manifest->entries) {
      if (e.offset + RoundUp(e.length, kBlock) > capacity_) {
        return Status::InvalidArgument(
            "swap capacity " + std::to_string(capacity_) +
            " bytes is smaller than the committed extent '" + e.key + "' (ends at " +
            std::to_string(e.offset + RoundUp(e.length, kBlock)) + "); give a larger capacity");
      }
    }
    committed_step_ = manifest->step;
  } else {
    if (options_.capacity_bytes == 0) {
      return Status::InvalidArgument(
          "swap store: capacity is 0 bytes; give the bytes of "
          "extent space the store needs");
    }
    stripe_ = options_.stripe_bytes ? options_.stripe_bytes : kDefaultStripe;
    capacity_ = RoundUp(options_.capacity_bytes, kBlock);
  }
  const uint64_t stripes = (capacity_ + stripe_ - 1) / stripe_;
  file_bytes_ = (stripes + n - 1) / n * stripe_;

  // Existing data files must cover every committed extent ("swap files that come back
  // short" are caught here, not as checksum errors later).
  std::vector<uint64_t> needed_end(n, 0);
  if (manifest) {
    std::vector<Chunk> chunks;
    for (const ManifestEntry& e : manifest->entries) {
      chunks.clear();
      MapRange(e.offset, RoundUp(e.length, kBlock), &chunks);
      for (const Chunk& c : chunks) {
        needed_end[c.path] = std::max(needed_end[c.path], c.file_offset + c.length);
      }
    }
  }

  // Free space, before anything is written: sum what each file system must still provide.
  struct FsNeed {
    std::vector<std::string> folders;
    uint64_t need = 0;
    uint64_t free = 0;
  };
  std::map<dev_t, FsNeed> by_fs;
  for (size_t i = 0; i < n; ++i) {
    const PathState& ps = *paths_[i];
    struct stat fst {};
    uint64_t have = 0;
    if (fstatat(ps.dir_fd, ps.file_name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!S_ISREG(fst.st_mode)) {
        return Status::InvalidArgument(
                   "refusing swap file " + ps.file + ": it is " +
                   (S_ISLNK(fst.st_mode) ? "a symbolic link" : "not a regular file") +
                   "; the store writes only its own regular files. Remove it or use another "
                   "folder")
            .WithPath(ps.file);
      }
      have = static_cast<uint64_t>(fst.st_blocks) * 512;
      if (static_cast<uint64_t>(fst.st_size) < needed_end[i]) {
        return Status::Corruption(
                   "swap file " + ps.file + " came back short: " + std::to_string(fst.st_size) +
                   " bytes, but the committed extents need " + std::to_string(needed_end[i]) +
                   "; it was truncated or replaced. Restore it from a "
                   "checkpoint")
            .WithPath(ps.file);
      }
    } else if (manifest && !manifest->entries.empty() && needed_end[i] > 0) {
      return Status::Corruption("swap file " + ps.file +
                                " named by the manifest is missing; restore it from a "
                                "checkpoint or give the folders in their original order")
          .WithPath(ps.file);
    }
    struct stat dst {};
    struct statvfs vfs {};
    if (fstat(ps.dir_fd, &dst) != 0 || fstatvfs(ps.dir_fd, &vfs) != 0) {
      int err = errno;
      return Status::FromErrno(err, "statvfs " + ps.folder).WithPath(ps.folder);
    }
    FsNeed& fs = by_fs[dst.st_dev];
    fs.folders.push_back(ps.folder);
    fs.need += file_bytes_ > have ? file_bytes_ - have : 0;
    fs.free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  for (const auto& by : by_fs) {
    const FsNeed& fs = by.second;  // not a structured binding: clang 14 lambdas cannot capture one
    if (fs.need <= fs.free) continue;
    std::string who =
        fs.folders.size() == 1 ? "swap folder " + fs.folders[0] : "swap folders " + [&] {
          std::string s;
          for (const auto& f : fs.folders) s += (s.empty() ? "" : ", ") + f;
          return s + " (one file system)";
        }();
    return Status::NoSpace(who + " cannot hold the swap files: " + FormatBytesExact(fs.free) +
                           " free, " + FormatBytesExact(fs.need) + " needed (capacity " +
                           FormatBytesExact(capacity_) + " over " + std::to_string(n) +
                           " folder(s)); free space there, lower the swap capacity, or add "
                           "swap folders on other drives")
        .WithPath(fs.folders[0]);
  }

  if (backend) {
    backend_ = std::move(backend);
  } else {
    STRATA_ASSIGN_OR_RETURN(backend_, CreateIoBackend(options_.backend));
  }
  backend_name_ = std::string(backend_->Name());
  for (auto& ps : paths_) {
    OpenOptions oo;
    oo.create = true;
    oo.direct = options_.backend.direct;
    oo.dir_fd = ps->dir_fd;
    oo.no_follow = true;
    oo.mode = 0600;
    // A new file is created, never taken over; an existing one must be a plain file.
    struct stat fst {};
    oo.exclusive = fstatat(ps->dir_fd, ps->file_name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) != 0;
    auto handle = backend_->OpenFile(ps->file_name, oo);
    if (!handle.ok()) return handle.status();
    ps->handle = *handle;
    ps->direct = backend_->IsDirect(ps->handle);
    Status s = backend_->Allocate(ps->handle, file_bytes_);
    if (!s.ok()) {
      return s.Annotate("preallocating swap file " + ps->file + " (" +
                        FormatBytesExact(file_bytes_) + ")");
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  ranges_.Reset(capacity_);
  if (manifest) {
    for (ManifestEntry& e : manifest->entries) {
      auto v = std::make_shared<Version>();
      v->offset = e.offset;
      v->length = e.length;
      v->alloc = RoundUp(e.length, kBlock);
      v->checksum = e.checksum;
      v->step = e.step;
      v->committed = true;
      if (v->alloc > 0) {
        // The extent must lie wholly inside free space: no two extents overlap.
        if (!ranges_.Claim(v->offset, v->alloc)) {
          return Status::Corruption("swap store manifest " + manifest_path_ + ": extent '" + e.key +
                                    "' overlaps another extent")
              .WithPath(manifest_path_);
        }
        in_use_ += v->alloc;
        committed_bytes_ += v->alloc;
      }
      Entry& en = entries_[e.key];
      if (en.committed) {
        return Status::Corruption("swap store manifest " + manifest_path_ + " names '" + e.key +
                                  "' twice")
            .WithPath(manifest_path_);
      }
      en.committed = std::move(v);
    }
  } else {
    // A new store: an empty manifest makes the next Open find it.
    Manifest m;
    m.num_paths = static_cast<uint32_t>(n);
    m.stripe_bytes = stripe_;
    m.capacity_bytes = capacity_;
    STRATA_RETURN_IF_ERROR(WriteManifest(m));
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

void SwapStore::MapRange(uint64_t offset, uint64_t length, std::vector<Chunk>* out) const {
  const uint64_t n = paths_.size();
  while (length > 0) {
    const uint64_t s = offset / stripe_;
    const uint64_t within = offset % stripe_;
    const uint64_t len = std::min(stripe_ - within, length);
    out->push_back(Chunk{static_cast<uint32_t>(s % n), (s / n) * stripe_ + within, len});
    offset += len;
    length -= len;
  }
}

std::string SwapStore::DescribeLocation(const Version& v) const {
  std::vector<Chunk> chunks;
  MapRange(v.offset, v.alloc, &chunks);
  std::string s;
  for (size_t i = 0; i < chunks.size() && i < 4; ++i) {
    s += (i ? ", " : "") + paths_[chunks[i].path]->file + " offset " +
         std::to_string(chunks[i].file_offset) + " (" + std::to_string(chunks[i].length) +
         " bytes)";
  }
  if (chunks.size() > 4) s += " and " + std::to_string(chunks.size() - 4) + " more pieces";
  return s;
}

Result<uint64_t> SwapStore::AllocateLocked(uint64_t bytes, std::string_view key) {
  if (std::optional<uint64_t> offset = ranges_.Allocate(bytes)) {
    in_use_ += bytes;
    return *offset;
  }
  const uint64_t largest = ranges_.LargestFree();
  return Status::NoSpace("swap store is full: no room for " + FormatBytesExact(bytes) +
                         " of extent '" + std::string(key) + "'; capacity " +
                         FormatBytesExact(capacity_) + ", in use " + FormatBytesExact(in_use_) +
                         " (committed " + FormatBytesExact(committed_bytes_) +
                         "), largest free range " + FormatBytesExact(largest) +
                         ". Commit to release superseded versions, or raise the capacity");
}

void SwapStore::FreeRangeLocked(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  in_use_ -= bytes;
  ranges_.Free(offset, bytes);
}

void SwapStore::DropVersionLocked(const std::shared_ptr<Version>& v) {
  if (!v || v->dropped) return;
  v->dropped = true;
  if (v->committed) committed_bytes_ -= v->alloc;
  if (v->readers == 0 && !v->freed) {
    v->freed = true;
    FreeRangeLocked(v->offset, v->alloc);
  }
}

void SwapStore::ReleaseReaderLocked(const std::shared_ptr<Version>& v) {
  if (--v->readers == 0 && v->dropped && !v->freed) {
    v->freed = true;
    FreeRangeLocked(v->offset, v->alloc);
  }
}

std::shared_ptr<SwapStore::Version> SwapStore::VisibleLocked(const Entry& e) const {
  if (e.deleted) return nullptr;
  return e.pending ? e.pending : e.committed;
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
    uint64_t sum = Checksum64(sop.buffer, sop.length);
    std::lock_guard<std::mutex> lock(mu_);
    auto v = std::make_shared<Version>();
    v->length = sop.length;
    v->alloc = RoundUp(sop.length, kBlock);
    v->checksum = sum;
    if (v->alloc > 0) {
      Result<uint64_t> off = AllocateLocked(v->alloc, sop.key);
      if (!off.ok()) {
        op->status = off.status();
        ready_.push_back(SwapCompletion{ticket, op->kind, op->key, 0, op->status});
        return ticket;
      }
      v->offset = *off;
    }
    op->seq = ++seq_;
    op->version = std::move(v);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(sop.key);
    std::shared_ptr<Version> v = it == entries_.end() ? nullptr : VisibleLocked(it->second);
    Status err;
    if (!v) {
      err = Status::NotFound("no extent '" + sop.key + "' in the swap store");
    } else if (v->length > sop.length) {
      err = Status::InvalidArgument("extent '" + sop.key + "' has " + std::to_string(v->length) +
                                    " bytes but the read buffer " + std::to_string(sop.length));
    }
    if (!err.ok()) {
      ready_.push_back(SwapCompletion{ticket, op->kind, op->key, 0, err});
      return ticket;
    }
    ++v->readers;
    op->length = v->length;
    op->version = std::move(v);
  }

  // Requests: whole blocks straight from/to the caller's buffer, the partial tail block
  // through the bounce block.
  const Version& v = *op->version;
  const uint64_t whole = op->length / kBlock * kBlock;
  const IoOp kind = op->kind;
  auto add = [&](uint64_t logical, uint64_t len, char* buf) {
    size_t first = op->chunks.size();
    MapRange(logical, len, &op->chunks);
    uint64_t pos = 0;
    for (size_t i = first; i < op->chunks.size(); ++i) {
      const Chunk& c = op->chunks[i];
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
  Version& v = *op->version;
  if (op->kind == IoOp::kRead) {
    if (op->status.ok() && op->tail) {
      std::memcpy(op->buffer + op->tail_pos, op->tail.get(), op->length - op->tail_pos);
    }
    if (op->status.ok()) {
      uint64_t got = Checksum64(op->buffer, op->length);
      if (got != v.checksum) {
        std::vector<Chunk> first;
        MapRange(v.offset, std::min<uint64_t>(v.alloc, kBlock), &first);
        op->status =
            Status::Corruption("checksum mismatch in extent '" + op->key + "' (" +
                               std::to_string(v.length) + " bytes, " +
                               (v.committed ? "committed at step " + std::to_string(v.step)
                                            : std::string("uncommitted")) +
                               "): stored XXH3 " + Hex(v.checksum) + ", read " + Hex(got) +
                               "; its data lies at " + DescribeLocation(v) +
                               ". The drive or file was damaged; restore from a checkpoint")
                .WithPath(paths_[first[0].path]->file)
                .WithOffset(first[0].file_offset);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (op->kind == IoOp::kRead) {
      ReleaseReaderLocked(op->version);
      if (op->status.ok()) {
        ++reads_;
        bytes_read_ += op->length;
        for (const Chunk& c : op->chunks) paths_[c.path]->bytes_read += c.length;
      }
    } else if (op->status.ok()) {
      ++writes_;
      bytes_written_ += op->length;
      for (const Chunk& c : op->chunks) paths_[c.path]->bytes_written += c.length;
      Entry& e = entries_[op->key];
      if (op->seq > e.seq) {
        DropVersionLocked(e.pending);
        e.pending = op->version;
        e.deleted = false;
        e.seq = op->seq;
      } else {
        DropVersionLocked(op->version);  // a later write or delete of the key won
      }
    } else {
      DropVersionLocked(op->version);
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
  SwapOp op{IoOp::kRead, std::string(key), buffer, capacity};
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
  auto it = entries_.find(key);
  if (it == entries_.end() || !VisibleLocked(it->second)) {
    return Status::NotFound("no extent '" + std::string(key) + "' in the swap store");
  }
  Entry& e = it->second;
  DropVersionLocked(e.pending);
  e.pending.reset();
  e.deleted = true;
  e.seq = ++seq_;
  return Status::OK();
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

Result<Manifest> SwapStore::ResolvePrepared(Manifest committed) {
  std::optional<Manifest> prepared;
  // Anything short of a complete manifest of a later step with the same geometry is a
  // commit cut short before its manifest was durable: not a prepared one.
  if (std::optional<std::string> bytes = folders_->ReadTemporary()) {
    auto m = swap_internal::DecodeManifest(*bytes, manifest_path_ + ".tmp");
    if (m.ok() && m->step && (!committed.step || *m->step > *committed.step) &&
        m->num_paths == committed.num_paths && m->stripe_bytes == committed.stripe_bytes &&
        m->capacity_bytes == committed.capacity_bytes) {
      prepared = std::move(*m);
    }
  }
  STRATA_ASSIGN_OR_RETURN(
      const bool roll_forward,
      options_.resolve_prepared(committed.step,
                                prepared ? prepared->step : std::optional<uint64_t>()));
  if (!roll_forward) return committed;
  if (!prepared) {
    return Status::InvalidArgument("swap store in " + options_.paths[0] +
                                   ": asked to roll forward a prepared commit, but there is none");
  }
  STRATA_RETURN_IF_ERROR(RenameManifestTemp().Annotate(
      "rolling the prepared commit of step " + std::to_string(*prepared->step) + " forward"));
  return std::move(*prepared);
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
    if (prepared_step_) {
      return Status::InvalidArgument("swap store: commit of step " + std::to_string(step) +
                                     " while step " + std::to_string(*prepared_step_) +
                                     " is prepared; finish it first");
    }
    if (committed_step_ && step <= *committed_step_) {
      return Status::InvalidArgument("swap store: commit of step " + std::to_string(step) +
                                     " after step " + std::to_string(*committed_step_) +
                                     "; steps must increase");
    }
  }
  while (!ops_.empty()) STRATA_RETURN_IF_ERROR(ProcessCompletions(ops_.size()));
  Hook("commit_begin");
  for (auto& ps : paths_) {
    Status s = backend_->Sync(ps->handle);
    if (!s.ok()) return s.Annotate("commit of step " + std::to_string(step));
  }
  Hook("data_synced");

  Manifest m;
  m.num_paths = static_cast<uint32_t>(paths_.size());
  m.stripe_bytes = stripe_;
  m.capacity_bytes = capacity_;
  m.step = step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m.entries.reserve(entries_.size());
    for (const auto& [key, e] : entries_) {
      std::shared_ptr<Version> v = VisibleLocked(e);
      if (!v) continue;
      m.entries.push_back(
          ManifestEntry{key, v->offset, v->length, v->checksum, v == e.pending ? step : v->step});
    }
  }
  Status s = WriteManifestTemp(m, sync_folder);
  if (!s.ok()) return s.Annotate("commit of step " + std::to_string(step));
  std::lock_guard<std::mutex> lock(mu_);
  prepared_step_ = step;
  prepared_seq_ = seq_;
  return Status::OK();
}

Status SwapStore::FinishLocked() {
  uint64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!prepared_step_) {
      return Status::InvalidArgument("swap store: FinishCommit without PrepareCommit");
    }
    if (seq_ != prepared_seq_) {
      return Status::InvalidArgument(
          "swap store: the extents changed between PrepareCommit and "
          "FinishCommit of step " +
          std::to_string(*prepared_step_));
    }
    step = *prepared_step_;
  }
  Hook("commit_finishing");
  Status s = RenameManifestTemp();
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    prepared_step_.reset();
    return s.Annotate("commit of step " + std::to_string(step));
  }

  // The new manifest is durable: the versions it no longer names may be reused.
  std::lock_guard<std::mutex> lock(mu_);
  prepared_step_.reset();
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    if (e.deleted) {
      DropVersionLocked(e.committed);
      it = entries_.erase(it);
      continue;
    }
    if (e.pending) {
      DropVersionLocked(e.committed);
      e.pending->committed = true;
      e.pending->step = step;
      committed_bytes_ += e.pending->alloc;
      e.committed = std::move(e.pending);
      e.pending.reset();
    }
    ++it;
  }
  committed_step_ = step;
  ++commits_;
  Hook("committed");
  return Status::OK();
}

std::optional<ExtentInfo> SwapStore::Lookup(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  std::shared_ptr<Version> v = VisibleLocked(it->second);
  if (!v) return std::nullopt;
  return ExtentInfo{v->length, v->checksum, v->committed, v->step};
}

std::vector<std::string> SwapStore::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [key, e] : entries_) {
    if (VisibleLocked(e)) keys.push_back(key);
  }
  return keys;
}

std::optional<uint64_t> SwapStore::CommittedStep() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_step_;
}

SwapStoreStats SwapStore::Stats() const {
  SwapStoreStats s;
  s.backend = backend_name_;
  std::lock_guard<std::mutex> lock(mu_);
  s.capacity_bytes = capacity_;
  s.stripe_bytes = stripe_;
  s.in_use_bytes = in_use_;
  s.committed_bytes = committed_bytes_;
  s.largest_free_bytes = ranges_.LargestFree();
  s.bytes_read = bytes_read_;
  s.bytes_written = bytes_written_;
  s.reads = reads_;
  s.writes = writes_;
  s.commits = commits_;
  for (const auto& [key, e] : entries_) s.extents += VisibleLocked(e) ? 1 : 0;
  s.committed_step = committed_step_;
  for (const auto& ps : paths_) {
    SwapPathStats p;
    p.folder = ps->folder;
    p.data_file = ps->file;
    p.file_bytes = file_bytes_;
    p.direct = ps->direct;
    p.bytes_read = ps->bytes_read;
    p.bytes_written = ps->bytes_written;
    struct statvfs vfs {};
    if (statvfs(ps->folder.c_str(), &vfs) == 0) {
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
