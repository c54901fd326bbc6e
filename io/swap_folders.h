// SwapFolders: the swap store's files on disk, apart from the extents in them. It owns
// each folder's descriptor and its lock (held for the store's life: two stores never share
// a folder), the checks on each folder's data file (present and long enough for what the
// manifest names, room on its file system) and how it is opened, and folder 0's manifest
// files: the committed manifest, a new one written under
// a temporary name and renamed over it, and the prepared one a two-phase commit can leave
// (SwapStore::PrepareCommit). Every file is opened relative to its folder's descriptor with
// O_NOFOLLOW, so a folder renamed or replaced later is not followed, and a symbolic link or
// a non-regular file under a store name is refused. Not thread-safe: SwapStore calls it
// from Open and from Commit (under its I/O mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/manifest.h"
#include "strata/io.h"
#include "strata/status.h"

namespace strata::swap_internal {

std::string JoinPath(const std::string& dir, const std::string& name);
// Reads `name` in the folder `dir_fd` (shown as `path`), refusing a link or non-regular file.
Result<std::string> ReadWholeFile(int dir_fd, const char* name, const std::string& path);

class SwapFolders {
 public:
  // Checks every folder (exists, is a folder, writable; none given twice), opens and locks
  // each, and records this process's pid in the lock file. Errors name the folder and say
  // what to do (another process holding a lock is named by its pid).
  static Result<std::unique_ptr<SwapFolders>> Open(const std::vector<std::string>& paths);
  // Whether `folder` holds a manifest (a regular file or not), looked up without opening
  // or locking anything: a store that is only to be reopened checks it first, so that a
  // folder it refuses is left as it was (no lock file made).
  static bool HasManifest(const std::string& folder);
  // `folder`'s committed manifest, read once and decoded without locking: the open's error
  // (NotFound without one; InvalidArgument for a link or non-regular file), Corruption
  // naming the file when it does not decode.
  static Result<Manifest> PeekManifest(const std::string& folder);
  // The committed step named by `folder`'s manifest (PeekManifest's; see
  // SwapStore::PeekCommittedStep).
  static Result<std::optional<uint64_t>> PeekCommittedStep(const std::string& folder);
  // The names of the files that hold the committed state in folder `index` of `folders`
  // (see SwapStore::StateFileNames).
  static std::vector<std::string> StateFileNames(size_t index, size_t folders);
  ~SwapFolders();
  SwapFolders(const SwapFolders&) = delete;
  SwapFolders& operator=(const SwapFolders&) = delete;

  size_t size() const { return folders_.size(); }
  const std::string& folder(size_t i) const { return folders_[i].path; }
  // Folder i's data file, "strata.swap.<i>-of-<n>", as a path for messages.
  const std::string& data_file(size_t i) const { return folders_[i].data_file; }
  int dir_fd(size_t i) const { return folders_[i].dir_fd; }
  const std::string& manifest_path() const { return manifest_path_; }

  // Before anything is written: each data file that exists is a regular file at least
  // needed_end[i] bytes long (Corruption: truncated or replaced), one that the manifest
  // needs (`has_extents`) exists, and each file system has room to grow every file to
  // `file_bytes` (NoSpace naming the folders, the free and needed bytes, and `capacity`).
  Status CheckDataFiles(const std::vector<uint64_t>& needed_end, bool has_extents,
                        uint64_t file_bytes, uint64_t capacity) const;
  // Opens folder i's data file through `backend`, relative to the folder, never following a
  // link: a new file is created (0600, exclusive), an existing one taken as it is.
  Result<int> OpenDataFile(IoBackend& backend, size_t i, bool direct) const;

  // The committed manifest, decoded (Corruption naming it when damaged); nullopt when
  // folder 0 has none.
  Result<std::optional<Manifest>> ReadManifest() const;
  // At Open: a complete prepared manifest (a two-phase commit cut short) of a later step
  // with the same geometry is offered to `decide` (SwapStoreOptions::resolve_prepared,
  // called whether there is one or not); when it answers true the prepared manifest is
  // renamed over the committed one. Returns the manifest that is now committed.
  using Decider = std::function<Result<bool>(std::optional<uint64_t> committed,
                                             std::optional<uint64_t> prepared)>;
  // `next_run_id` (when not empty) is accepted as the prepared manifest's identity too,
  // and then its capacity may differ (a store resumed on another rank count, whose first
  // commit records the new identity and the grown capacity).
  Result<Manifest> ResolvePrepared(Manifest committed, const Decider& decide,
                                   const std::string& next_run_id = {}) const;
  // The prepared manifest's bytes (strata.manifest.tmp), if any.
  static std::optional<std::string> PeekTemporary(const std::string& folder);
  // Writes `bytes` under the temporary name and syncs it (and folder 0 with `sync_folder`,
  // so that its name survives a power cut too). On failure the temporary file is removed.
  Status WriteTemporary(const std::string& bytes, bool sync_folder) const;
  // Renames the temporary file over the manifest and syncs folder 0.
  Status RenameTemporary() const;
  void RemoveTemporary() const;

 private:
  struct Folder {
    std::string path;
    std::string data_file_name;  // opened relative to dir_fd
    std::string data_file;       // path + "/" + data_file_name
    int dir_fd = -1;
    int lock_fd = -1;
  };
  SwapFolders() = default;
  // The bytes under the temporary name (a prepared manifest, or a commit cut short);
  // nullopt when there is no readable regular file there.
  std::optional<std::string> ReadTemporary() const;
  Status CheckFolders(const std::vector<std::string>& paths) const;
  Status OpenAndLock(const std::string& path);

  std::vector<Folder> folders_;
  std::string manifest_path_;
};

}  // namespace strata::swap_internal
