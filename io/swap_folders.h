// SwapFolders: the swap store's folders on disk, apart from the extents in them. It owns
// each folder's descriptor and its lock (held for the store's life: two stores never share
// a folder), and folder 0's manifest files: the committed manifest, a new one written under
// a temporary name and renamed over it, and the prepared one a two-phase commit can leave
// (SwapStore::PrepareCommit). Every file is opened relative to its folder's descriptor with
// O_NOFOLLOW, so a folder renamed or replaced later is not followed, and a symbolic link or
// a non-regular file under a store name is refused. Not thread-safe: SwapStore calls it
// from Open and from Commit (under its I/O mutex).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::swap_internal {

std::string JoinPath(const std::string& dir, const std::string& name);

class SwapFolders {
 public:
  // Checks every folder (exists, is a folder, writable; none given twice), opens and locks
  // each, and records this process's pid in the lock file. Errors name the folder and say
  // what to do (another process holding a lock is named by its pid).
  static Result<std::unique_ptr<SwapFolders>> Open(const std::vector<std::string>& paths);
  ~SwapFolders();
  SwapFolders(const SwapFolders&) = delete;
  SwapFolders& operator=(const SwapFolders&) = delete;

  size_t size() const { return folders_.size(); }
  const std::string& folder(size_t i) const { return folders_[i].path; }
  int dir_fd(size_t i) const { return folders_[i].dir_fd; }
  const std::string& manifest_path() const { return manifest_path_; }

  // The committed manifest's bytes; nullopt when folder 0 has none.
  Result<std::optional<std::string>> ReadManifest() const;
  // The bytes under the temporary name (a prepared manifest, or a commit cut short);
  // nullopt when there is no readable regular file there.
  std::optional<std::string> ReadTemporary() const;
  // Writes `bytes` under the temporary name and syncs it (and folder 0 with `sync_folder`,
  // so that its name survives a power cut too). On failure the temporary file is removed.
  Status WriteTemporary(const std::string& bytes, bool sync_folder) const;
  // Renames the temporary file over the manifest and syncs folder 0.
  Status RenameTemporary() const;
  void RemoveTemporary() const;

 private:
  struct Folder {
    std::string path;
    int dir_fd = -1;
    int lock_fd = -1;
  };
  SwapFolders() = default;
  Status CheckFolders(const std::vector<std::string>& paths) const;
  Status OpenAndLock(const std::string& path);

  std::vector<Folder> folders_;
  std::string manifest_path_;
};

}  // namespace strata::swap_internal
