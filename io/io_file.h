// Helpers shared by the IoBackend implementations: opening a file with O_DIRECT and the
// buffered fallback, fallocate/fdatasync with actionable errors, and request validation.
//
// These are plain functions over file descriptors; they hold no state beyond what the
// caller passes in and are safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "strata/io.h"
#include "strata/status.h"

namespace strata::io_internal {

// An open file as a backend keeps it.
struct FileEntry {
  int fd = -1;             // -1 when the slot is free
  bool direct = false;     // opened with O_DIRECT
  bool read_only = false;  // opened O_RDONLY
  std::string path;
};

// Opens `path` as `options` ask. `allow_direct` is the backend's own switch (its options'
// `direct`); O_DIRECT is used only when both allow it. When the file system refuses
// O_DIRECT (EINVAL at open) or keeps files in memory (tmpfs, ramfs) the file is opened
// buffered and a warning names the path and why (once per folder per process).
// Fails with NotFound (missing file or folder), InvalidArgument or IOError naming the path.
Result<FileEntry> OpenFileEntry(const std::string& path, const OpenOptions& options,
                                bool allow_direct);

// Reserves `bytes` for `file` (fallocate, mode 0: the file grows to at least `bytes`).
// NoSpace on ENOSPC naming the path and the bytes asked; falls back to ftruncate where the
// file system lacks fallocate (EOPNOTSUPP).
Status AllocateFile(const FileEntry& file, uint64_t bytes);

// fdatasync; IOError naming the path.
Status SyncFile(const FileEntry& file);

// Checks one request against the file table: known open file, non-null buffer when length
// > 0, a write not aimed at a read-only file, and 4 KiB alignment of offset, length and
// buffer for an O_DIRECT file. InvalidArgument naming what is wrong.
Status ValidateRequest(const IoRequest& request, const FileEntry* file);

// "read" / "write".
inline const char* OpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

// The status of a failed transfer: errno, path, offset and the operation.
Status TransferError(int err, IoOp op, const FileEntry& file, uint64_t offset, uint64_t length);

// The status of a read that hit end of file before `length` bytes.
Status EndOfFileError(const FileEntry& file, uint64_t offset, uint64_t length, uint64_t done);

}  // namespace strata::io_internal
