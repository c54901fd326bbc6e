// StoreReader (strata/store_reader.h): a swap store's committed version, read-only.
#include "strata/store_reader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "io/manifest.h"
#include "io/swap_folders.h"
#include "io/swap_layout.h"
#include "strata/bytes.h"

namespace strata {

using swap_internal::JoinPath;
using swap_internal::Manifest;
using swap_internal::SwapChunk;
using swap_internal::SwapLayout;

namespace {

constexpr char kManifestName[] = "strata.manifest";
constexpr char kLockName[] = "strata.lock";

std::string DataFileName(size_t index, size_t folders) {
  return "strata.swap." + std::to_string(index) + "-of-" + std::to_string(folders);
}

std::string Hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Result<std::string> ReadSmallFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::FromErrno(errno, "opening " + path).WithPath(path);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::InvalidArgument(path + " is not a regular file").WithPath(path);
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(got);
  return out;
}

// One read of the loop: a stretch of one extent within one stripe chunk.
struct Piece {
  size_t index;     // into keys
  uint64_t offset;  // in the extent
  uint64_t length;  // bytes read (4 KiB multiple)
  uint64_t useful;  // bytes of the extent in it
  uint32_t file;
  uint64_t file_offset;
  bool last;
};

// Why piece `p` of extent `key` cannot be read from data file `f` (missing, or shorter than
// the piece: Corruption naming the file and the offset), or OK.
Status PieceUnreadable(const std::string& key, const Piece& p, const StoreDataFile& f,
                       bool opened) {
  const std::string where = "offset " + std::to_string(p.file_offset) + " of " + f.path;
  if (!f.exists || !opened) {
    return Status::Corruption("extent " + key + " lies at " + where + ", which is missing")
        .WithPath(f.path)
        .WithOffset(p.file_offset);
  }
  if (p.file_offset + p.length > f.bytes) {
    return Status::Corruption("extent " + key + " lies at " + where + ", which is " +
                              std::to_string(f.bytes) + " bytes long (truncated)")
        .WithPath(f.path)
        .WithOffset(p.file_offset);
  }
  return Status::OK();
}

}  // namespace

struct StoreReader::Impl {
  std::unique_ptr<IoBackend> backend;
  std::vector<int> handles;   // per data file; -1 when missing
  std::vector<int> lock_fds;  // shared flocks held for the reader's life
  SwapLayout layout;
  std::vector<swap_internal::ManifestEntry> entries;  // by key, as extents_
  std::vector<void*> buffers;
  uint64_t request_bytes = 0;

  // Appends extent `k`'s pieces: one per stripe chunk, at most request_bytes each, the last
  // marked; an empty extent gets one empty piece.
  void CutIntoPieces(size_t k, const swap_internal::ManifestEntry& e,
                     std::vector<Piece>* pieces) const {
    const uint64_t len = e.length;
    std::vector<SwapChunk> chunks;
    layout.Map(e.offset, RoundUp(len, kIoAlignment), &chunks);
    uint64_t at = 0;
    for (const SwapChunk& c : chunks) {
      for (uint64_t o = 0; o < c.length; o += request_bytes) {
        const uint64_t n = std::min(request_bytes, c.length - o);
        pieces->push_back(Piece{k, at, n, std::min(n, len - std::min(len, at)), c.path,
                                c.file_offset + o, false});
        at += n;
      }
    }
    if (pieces->empty() || pieces->back().index != k)
      pieces->push_back(Piece{k, 0, 0, 0, 0, 0, false});
    pieces->back().last = true;
  }

  ~Impl() {
    if (backend) {
      for (int h : handles) {
        if (h >= 0) (void)backend->CloseFile(h);
      }
    }
    for (void* b : buffers) std::free(b);
    for (int fd : lock_fds) close(fd);
  }
};

StoreReader::~StoreReader() = default;

std::string StoreReader::backend_name() const { return std::string(impl_->backend->Name()); }

const StoreExtentInfo* StoreReader::Find(const std::string& key) const {
  auto it =
      std::lower_bound(extents_.begin(), extents_.end(), key,
                       [](const StoreExtentInfo& e, const std::string& k) { return e.key < k; });
  return it != extents_.end() && it->key == key ? &*it : nullptr;
}

Result<std::unique_ptr<StoreReader>> StoreReader::Open(const std::vector<std::string>& folders,
                                                       const StoreReaderOptions& options) {
  if (folders.empty()) return Status::InvalidArgument("StoreReader: no folder given");
  if (options.request_bytes == 0 || options.request_bytes % kIoAlignment != 0) {
    return Status::InvalidArgument("StoreReader: request_bytes " +
                                   std::to_string(options.request_bytes) +
                                   " is not a positive multiple of 4 KiB");
  }
  std::unique_ptr<StoreReader> r(new StoreReader());
  r->impl_ = std::make_unique<Impl>();
  Impl& im = *r->impl_;

  // A live run reuses superseded versions' space: refuse a store whose lock is held. The
  // shared lock taken here keeps a run from opening the store while it is read.
  for (const std::string& folder : options.lock ? folders : std::vector<std::string>{}) {
    const std::string lock = JoinPath(folder, kLockName);
    const int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // a store copied without its lock file
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
      const int err = errno;
      close(fd);
      if (err == EWOULDBLOCK) {
        auto pid = ReadSmallFile(lock);
        std::string who = pid.ok() ? pid->substr(0, pid->find_first_of("\n ")) : "";
        return Status::Aborted("the swap store in " + folder + " is in use by a live process" +
                               (who.empty() ? "" : " (pid " + who + ")") +
                               " that rewrites it; stop that run, or wait for it to end, "
                               "then check or export the store")
            .WithPath(lock);
      }
      return Status::FromErrno(err, "locking " + lock + " (shared)").WithPath(lock);
    }
    im.lock_fds.push_back(fd);
  }

  r->manifest_path_ = JoinPath(folders[0], kManifestName);
  auto bytes = ReadSmallFile(r->manifest_path_);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("no swap store in " + folders[0] + ": " + r->manifest_path_ +
                              " is missing; give the folder a run's --nvme named")
          .WithPath(r->manifest_path_);
    }
    return bytes.status();
  }
  STRATA_ASSIGN_OR_RETURN(Manifest m, swap_internal::DecodeManifest(*bytes, r->manifest_path_));
  if (m.num_paths != folders.size()) {
    return Status::InvalidArgument(
        "the swap store in " + folders[0] + " was made over " + std::to_string(m.num_paths) +
        " folder(s), " + std::to_string(folders.size()) + " given; give all its folders in order");
  }
  r->step_ = m.step;
  r->run_id_ = m.run_id;
  r->stripe_ = m.stripe_bytes;
  im.layout.stripe = m.stripe_bytes;
  im.layout.capacity = m.capacity_bytes;
  im.layout.files = m.num_paths;
  std::sort(m.entries.begin(), m.entries.end(),
            [](const auto& a, const auto& b) { return a.key < b.key; });
  im.entries = m.entries;

  const std::vector<uint64_t> needed = im.layout.NeededEnds(m);
  IoBackendOptions io = options.io;
  STRATA_ASSIGN_OR_RETURN(im.backend, CreateIoBackend(io));
  r->direct_ = io.direct;
  for (size_t i = 0; i < folders.size(); ++i) {
    StoreDataFile f;
    f.path = JoinPath(folders[i], DataFileName(i, folders.size()));
    f.needed_end = needed[i];
    struct stat st {};
    int handle = -1;
    if (lstat(f.path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      f.exists = true;
      f.bytes = static_cast<uint64_t>(st.st_size);
      auto h = im.backend->OpenFile(
          f.path, OpenOptions{.read_only = true, .direct = io.direct, .no_follow = true});
      if (!h.ok()) return h.status();
      handle = *h;
      r->direct_ = r->direct_ && im.backend->IsDirect(handle);
    }
    if (!f.exists && f.needed_end > 0) {
      r->problems_.push_back(Status::Corruption("data file " + f.path +
                                                " is missing; the manifest's extents need " +
                                                std::to_string(f.needed_end) + " bytes of it")
                                 .WithPath(f.path));
    } else if (f.exists && f.bytes < f.needed_end) {
      r->problems_.push_back(
          Status::Corruption("data file " + f.path + " is " + std::to_string(f.bytes) +
                             " bytes, shorter than the " + std::to_string(f.needed_end) +
                             " its committed extents need (truncated?)")
              .WithPath(f.path)
              .WithOffset(f.bytes));
    }
    im.handles.push_back(handle);
    r->files_.push_back(std::move(f));
  }
  std::vector<SwapChunk> chunks;
  for (const auto& e : im.entries) {
    chunks.clear();
    im.layout.Map(e.offset, std::max<uint64_t>(RoundUp(e.length, kIoAlignment), 1), &chunks);
    r->extents_.push_back(StoreExtentInfo{e.key, e.length, e.checksum, e.step,
                                          r->files_[chunks[0].path].path, chunks[0].file_offset});
  }

  im.request_bytes = std::min(options.request_bytes, m.stripe_bytes);
  const uint32_t depth = std::max<uint32_t>(1, im.backend->QueueDepth());
  std::vector<BufferRegion> regions;
  for (uint32_t i = 0; i < depth; ++i) {
    void* b = std::aligned_alloc(kIoAlignment, im.request_bytes);
    if (b == nullptr) return Status::OutOfMemory("StoreReader: read buffers");
    im.buffers.push_back(b);
    regions.push_back({b, im.request_bytes});
  }
  STRATA_RETURN_IF_ERROR(im.backend->RegisterBuffers(regions));
  return r;
}

// The read loop. Every extent is cut into pieces (one per stripe chunk, at most
// request_bytes each) read in order; piece i lands in buffer i % depth, so up to `depth`
// are in flight and they are consumed strictly in order (the checksum is a stream). A piece
// whose file is missing or too short is not submitted: it completes at once with the
// Corruption naming it. Whatever happens, nothing returns while a read is in flight into the
// buffers.
Status StoreReader::Read(std::span<const std::string> keys, const Sink& sink,
                         const std::function<void(size_t, const Status&)>& on_bad) {
  Impl& im = *impl_;
  std::vector<const swap_internal::ManifestEntry*> entry(keys.size());
  std::vector<Piece> pieces;
  for (size_t k = 0; k < keys.size(); ++k) {
    const StoreExtentInfo* info = Find(keys[k]);
    if (info == nullptr) {
      return Status::NotFound("extent " + keys[k] + " is not in the store's manifest " +
                              manifest_path_);
    }
    entry[k] = &im.entries[static_cast<size_t>(info - extents_.data())];
    im.CutIntoPieces(k, *entry[k], &pieces);
  }

  const size_t depth = im.buffers.size();
  std::vector<Status> slot_status(depth);
  std::vector<bool> slot_done(depth, false);
  size_t next_submit = 0, next_consume = 0;
  Status first_error;
  std::vector<bool> bad(keys.size(), false);
  XXH3_state_t* hash = XXH3_createState();
  if (hash == nullptr) return Status::OutOfMemory("StoreReader: checksum state");
  std::vector<IoRequest> batch;
  std::vector<IoCompletion> done(depth);

  auto fail = [&](size_t k, Status s) {
    if (bad[k]) return;
    bad[k] = true;
    if (s.code() == StatusCode::kCorruption && on_bad) {
      on_bad(k, s);
    } else if (first_error.ok()) {
      first_error = std::move(s);
    }
  };

  while (next_consume < pieces.size()) {
    if (!first_error.ok() && im.backend->InFlight() == 0) break;
    batch.clear();
    while (first_error.ok() && next_submit < pieces.size() && next_submit - next_consume < depth) {
      const Piece& p = pieces[next_submit];
      const size_t slot = next_submit % depth;
      slot_done[slot] = false;
      slot_status[slot] = Status::OK();
      Status unreadable = p.length == 0 ? Status::OK()
                                        : PieceUnreadable(keys[p.index], p, files_[p.file],
                                                          im.handles[p.file] >= 0);
      if (p.length == 0 || !unreadable.ok()) {
        slot_done[slot] = true;
        slot_status[slot] = std::move(unreadable);
      } else {
        batch.push_back(IoRequest{IoOp::kRead, im.handles[p.file], p.file_offset, im.buffers[slot],
                                  p.length, next_submit});
      }
      ++next_submit;
    }
    if (!batch.empty()) {
      Status s = im.backend->Submit(batch);
      if (!s.ok()) {
        // None of the batch is in flight: fail them all and stop submitting.
        for (const IoRequest& q : batch) {
          slot_done[q.user_data % depth] = true;
          slot_status[q.user_data % depth] = s;
        }
      }
    }
    const size_t slot = next_consume % depth;
    if (!slot_done[slot]) {
      auto n = im.backend->Poll(done, 1);
      if (!n.ok()) {
        if (first_error.ok()) first_error = n.status();
        break;  // the backend is broken: nothing more completes
      }
      for (size_t i = 0; i < *n; ++i) {
        slot_done[done[i].user_data % depth] = true;
        slot_status[done[i].user_data % depth] = std::move(done[i].status);
      }
      continue;
    }
    const Piece& p = pieces[next_consume];
    const size_t k = p.index;
    if (p.offset == 0) XXH3_64bits_reset(hash);
    if (!bad[k] && first_error.ok()) {
      if (!slot_status[slot].ok()) {
        fail(k, slot_status[slot]);
      } else if (p.useful > 0) {
        bytes_read_ += p.length;
        const auto* data = static_cast<const uint8_t*>(im.buffers[slot]);
        XXH3_64bits_update(hash, data, p.useful);
        Status s = sink(k, p.offset, std::span<const uint8_t>(data, p.useful));
        if (!s.ok() && first_error.ok()) first_error = std::move(s);
      }
      if (p.last && !bad[k] && first_error.ok()) {
        const uint64_t got = XXH3_64bits_digest(hash);
        if (got != entry[k]->checksum) {
          const StoreExtentInfo& e = *Find(keys[k]);
          fail(k, Status::Corruption("extent " + keys[k] + " (" + std::to_string(e.length) +
                                     " bytes at offset " + std::to_string(e.file_offset) + " of " +
                                     e.file + ") fails its checksum: the manifest says " +
                                     Hex(entry[k]->checksum) + ", the bytes give " + Hex(got) +
                                     "; the store is damaged")
                      .WithPath(e.file)
                      .WithOffset(e.file_offset));
        }
      }
    }
    ++next_consume;
  }
  // Drain: no buffer may still be a read's target when this returns.
  while (im.backend->InFlight() > 0) {
    auto n = im.backend->Poll(done, 1);
    if (!n.ok()) break;
  }
  XXH3_freeState(hash);
  return first_error;
}

}  // namespace strata
