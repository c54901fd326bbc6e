// StoreReader: one swap store's committed version, read without opening the store for
// training. What `strata verify` and `strata export` read a run's stores with (one reader per
// rank; a run of N ranks has N stores, each holding its shard of every block).
//
// Read-only by construction: the manifest and the data files are opened O_RDONLY (data files
// through an IoBackend: io_uring with O_DIRECT where the file system allows), nothing is
// created, locked exclusively, renamed or written, and a store a live process holds (its lock
// file flock'ed) is refused, since a live run reuses the space of superseded versions under a
// reader's feet. A damaged manifest is refused at Open; a data file that is missing or shorter
// than the manifest's extents need is not: Open reports it in problems() and each read of an
// extent that lies there fails naming the file and the offset, so that a caller can check the
// rest of the store.
//
// Thread safety: none; one thread uses a reader at a time (its backend is one ring).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/io.h"
#include "strata/status.h"

namespace strata {

// One extent of the committed version, as the manifest names it.
struct StoreExtentInfo {
  std::string key;           // "b3.master": block 3's master weights (this rank's shard)
  uint64_t length = 0;       // bytes
  uint64_t checksum = 0;     // XXH3-64 of the bytes
  uint64_t step = 0;         // the commit that wrote this version
  std::string file;          // the data file holding its first byte
  uint64_t file_offset = 0;  // where in that file
};

// One of the store's data files (one per folder).
struct StoreDataFile {
  std::string path;
  bool exists = false;
  uint64_t bytes = 0;       // its size on disk (apparent)
  uint64_t needed_end = 0;  // the end of the last byte the committed extents occupy in it
};

struct StoreReaderOptions {
  IoBackendOptions io;                  // kind, queue depth (requests in flight), O_DIRECT
  uint64_t request_bytes = 1ull << 20;  // bytes per read request (a multiple of 4 KiB)
  // false: the lock files are neither checked nor flock'ed. Only for a caller that knows
  // no one rewrites the committed extents while it reads: the ranks of a resume on another
  // rank count, which hold the stores and write nothing over a committed extent until every
  // rank has read its shards (their first commit follows an all-gather).
  bool lock = true;
};

class StoreReader {
 public:
  // Opens the store whose folders are `folders`, in the order the run gave them (folder 0
  // holds the manifest). NotFound when folder 0 has no manifest; Corruption naming the
  // manifest when it fails its checksum or cannot be decoded; InvalidArgument when the
  // manifest was made over another number of folders; Aborted naming the lock file when a
  // live process holds the store.
  static Result<std::unique_ptr<StoreReader>> Open(const std::vector<std::string>& folders,
                                                   const StoreReaderOptions& options = {});
  ~StoreReader();
  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  const std::string& manifest_path() const { return manifest_path_; }
  std::optional<uint64_t> step() const { return step_; }  // none: never committed
  const std::string& run_id() const { return run_id_; }   // "" in a version-1 manifest
  uint64_t stripe_bytes() const { return stripe_; }
  const std::vector<StoreExtentInfo>& extents() const { return extents_; }  // sorted by key
  const StoreExtentInfo* Find(const std::string& key) const;
  const std::vector<StoreDataFile>& data_files() const { return files_; }
  // Whether the data files are read with O_DIRECT (false after a buffered fallback).
  bool direct() const { return direct_; }
  std::string backend_name() const;
  // What Open found wrong without refusing: a data file missing or shorter than its extents
  // need (each message names the file, its size and the bytes needed).
  const std::vector<Status>& problems() const { return problems_; }

  // Receives extent `index` (into the keys given to Read) from byte `offset` on, in order:
  // each extent's pieces arrive front to back, the extents in the order given. A non-OK
  // return stops the read and is returned.
  using Sink = std::function<Status(size_t index, uint64_t offset, std::span<const uint8_t> bytes)>;
  // Reads the extents `keys`, each whole, keeping the backend's queue full across them, and
  // verifies each one's checksum after its last piece: Corruption naming the key, the data
  // file and the offset when it does not match (the sink has seen the bytes by then: a caller
  // that writes them discards its output on a failure), when the extent lies beyond the end
  // of its data file or the file is missing. NotFound naming a key the manifest lacks; the
  // backend's IOError on a failed read. With `keep_going`, a Corruption of one extent does
  // not stop the others: each is passed to `on_bad` and the read goes on.
  Status Read(std::span<const std::string> keys, const Sink& sink,
              const std::function<void(size_t index, const Status&)>& on_bad = nullptr);

  // Bytes Read has moved from the data files so far.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Impl;
  StoreReader() = default;

  std::unique_ptr<Impl> impl_;
  std::string manifest_path_;
  std::optional<uint64_t> step_;
  std::string run_id_;
  uint64_t stripe_ = 0;
  std::vector<StoreExtentInfo> extents_;
  std::vector<StoreDataFile> files_;
  std::vector<Status> problems_;
  bool direct_ = false;
  uint64_t bytes_read_ = 0;
};

}  // namespace strata
