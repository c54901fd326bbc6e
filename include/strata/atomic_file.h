// AtomicFile: writes an output file (weights, a JSON report, a trace) so that the path holds
// either its previous contents or the complete new ones, never a torn or empty file, even
// across a power cut.
//
// How. The bytes go to a temporary file created next to the destination (same folder, so the
// rename cannot cross file systems) with O_CREAT|O_EXCL|O_NOFOLLOW relative to the folder's
// descriptor; Commit flushes and fsyncs it, renames it over the destination and fsyncs the
// folder so the rename itself is durable. The file gets `mode` exactly (fchmod), whatever
// the umask. A destination that exists and is not a regular file (a folder, a symbolic link,
// a device) is refused up front: the write never lands outside the folder named.
//
// Ownership. An AtomicFile owns its temporary file; destroying it without Commit removes the
// temporary and leaves the destination untouched. Not safe for concurrent use; one writer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

class AtomicFile {
 public:
  // Creates the temporary file for `path`. InvalidArgument when `path` names a folder, a
  // symbolic link or another non-regular file, or its folder does not exist; IOError naming
  // the folder when it cannot be written.
  static Result<std::unique_ptr<AtomicFile>> Create(const std::string& path, uint32_t mode = 0644);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Buffered stream over the temporary file; valid until Commit.
  std::FILE* stream() { return file_; }
  Status Write(std::string_view bytes);
  // Flush, fsync, rename over the destination, fsync the folder. On failure the destination
  // is unchanged and the temporary is removed.
  Status Commit();
  const std::string& path() const { return path_; }

 private:
  AtomicFile() = default;
  void Discard();

  std::string path_;      // destination
  std::string folder_;    // its folder
  std::string base_;      // its file name
  std::string tmp_name_;  // temporary's name in the folder
  int dir_fd_ = -1;
  std::FILE* file_ = nullptr;
};

// Writes `bytes` to `path` through an AtomicFile.
Status WriteFileAtomic(const std::string& path, std::string_view bytes, uint32_t mode = 0644);

// Checks, before any work is done, that an output can later be written at `path`: its folder
// exists and is writable, and `path` is absent or a regular file. `flag` names the option
// in the message ("--save"). InvalidArgument saying what is wrong.
Status CheckOutputPath(const std::string& path, std::string_view flag);

}  // namespace strata
