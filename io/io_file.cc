#include "io/io_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>

#include "strata/log.h"

namespace strata::io_internal {
namespace {

int OpenRetryingEintr(const std::string& path, int flags, const OpenOptions& options) {
  const int dir = options.dir_fd >= 0 ? options.dir_fd : AT_FDCWD;
  int fd;
  do {
    fd = ::openat(dir, path.c_str(), flags, static_cast<mode_t>(options.mode));
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The path messages show: a name relative to OpenOptions::dir_fd gets the folder's path.
std::string DisplayPath(const std::string& path, const OpenOptions& options) {
  if (options.dir_fd < 0 || path.empty() || path[0] == '/') return path;
  char buf[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(options.dir_fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf));
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf)) return path;
  std::string folder(buf, static_cast<size_t>(n));
  return folder.back() == '/' ? folder + path : folder + "/" + path;
}

// With OpenOptions::no_follow: the open file must be a regular file with one link.
Status CheckPlainFile(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat " + path).WithPath(path);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("refusing " + path +
                                   ": it is not a regular file; remove it or pick another folder")
        .WithPath(path);
  }
  if (st.st_nlink > 1) {
    return Status::InvalidArgument("refusing " + path + ": it has " + std::to_string(st.st_nlink) +
                                   " hard links, so writing it would change a file elsewhere; "
                                   "remove it or pick another folder")
        .WithPath(path);
  }
  return Status::OK();
}

// Why a file system should not be used with O_DIRECT, or nullptr when it can be.
// tmpfs accepts O_DIRECT on recent kernels but keeps the data in memory anyway; bypassing
// a page cache that *is* the storage gains nothing, so such files are opened buffered.
const char* InMemoryFileSystem(int fd) {
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return nullptr;
  if (fs.f_type == TMPFS_MAGIC) return "tmpfs";
  if (fs.f_type == RAMFS_MAGIC) return "ramfs";
  return nullptr;
}

Status OpenError(int err, const std::string& path, const OpenOptions& options) {
  std::string what;
  switch (err) {
    case ENOENT: {
      std::filesystem::path p(path);
      std::error_code ec;
      const auto parent = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
      if (!std::filesystem::is_directory(parent, ec)) {
        what = "cannot open " + path + ": folder " + parent.string() +
               " does not exist; create it or pick another path";
      } else {
        what = "cannot open " + path + ": file does not exist; give the path of an existing file";
      }
      break;
    }
    case EACCES:
    case EPERM:
      what = "cannot open " + path + (options.read_only ? " for reading" : " for writing") +
             ": permission denied; pick a path you may write to";
      break;
    case EROFS:
      what = "cannot open " + path + " for writing: the file system is read-only";
      break;
    case EISDIR:
      what = "cannot open " + path + ": it is a folder, not a file";
      break;
    case ELOOP:
      what = "refusing " + path +
             ": it is a symbolic link, which could lead outside its folder; remove it or pick "
             "another folder";
      break;
    case EEXIST:
      what = "cannot create " + path + ": a file of that name already exists";
      break;
    default:
      what = "cannot open " + path;
  }
  return Status::FromErrno(err, what).WithPath(path);
}

}  // namespace

Result<FileEntry> OpenFileEntry(const std::string& path, const OpenOptions& options,
                                bool allow_direct) {
  if (path.empty()) return Status::InvalidArgument("cannot open a file with an empty path");
  int flags = O_CLOEXEC | (options.read_only ? O_RDONLY : O_RDWR);
  if (options.create && !options.read_only) flags |= O_CREAT;
  if (options.create && !options.read_only && options.exclusive) flags |= O_EXCL;
  // O_NONBLOCK: opening a FIFO planted under the name must not hang; regular files ignore it.
  if (options.no_follow) flags |= O_NOFOLLOW | O_NONBLOCK;
  const bool want_direct = allow_direct && options.direct;

  FileEntry entry;
  entry.path = DisplayPath(path, options);
  entry.read_only = options.read_only;
  int fd = OpenRetryingEintr(path, flags | (want_direct ? O_DIRECT : 0), options);
  std::string fallback_reason;
  if (fd < 0 && want_direct && errno == EINVAL) {
    // The file system refuses O_DIRECT at open (older tmpfs, some FUSE and network mounts).
    fd = OpenRetryingEintr(path, flags, options);
    if (fd >= 0) fallback_reason = "its file system does not support O_DIRECT";
  }
  if (fd < 0) return OpenError(errno, entry.path, options);
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return OpenError(EISDIR, entry.path, options);
  }
  if (options.no_follow) {
    Status plain = CheckPlainFile(fd, entry.path);
    if (!plain.ok()) {
      ::close(fd);
      return plain;
    }
    // O_NONBLOCK was for the open only: io_uring would hand -EAGAIN back for such a file.
    (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  }
  entry.fd = fd;
  entry.direct = want_direct && fallback_reason.empty();
  if (entry.direct) {
    if (const char* fs = InMemoryFileSystem(fd)) {
      // Re-open without O_DIRECT so the file's flags match what IsDirect() reports.
      int buffered = OpenRetryingEintr(path, flags & ~(O_CREAT | O_EXCL | O_NONBLOCK), options);
      if (buffered < 0) {
        int err = errno;
        ::close(fd);
        return OpenError(err, entry.path, options);
      }
      ::close(fd);
      entry.fd = buffered;
      entry.direct = false;
      fallback_reason = std::string("it is on ") + fs + ", which keeps data in memory";
    }
  }
  if (!fallback_reason.empty()) {
    // Once per folder per process: a striped store or a benchmark opens many files there,
    // often through several backends, and one line says all there is to say.
    static std::mutex mu;
    static std::set<std::string> warned_folders;
    const std::string folder = std::filesystem::path(entry.path).parent_path().string();
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = warned_folders.insert(folder).second;
    }
    std::string msg = "path " + entry.path + ": " + fallback_reason +
                      "; O_DIRECT is not used there, using buffered I/O";
    if (first) {
      LogWarning(msg);
    } else {
      LogDebug(msg);
    }
  }
  return entry;
}

Status AllocateFile(const FileEntry& file, uint64_t bytes) {
  if (bytes == 0) return Status::OK();
  int rc;
  do {
    rc = ::fallocate(file.fd, 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::OK();
  int err = errno;
  if (err == EOPNOTSUPP) {
    struct stat st;
    if (::fstat(file.fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) {
      return Status::OK();
    }
    if (::ftruncate(file.fd, static_cast<off_t>(bytes)) == 0) return Status::OK();
    err = errno;
  }
  if (err == ENOSPC || err == EDQUOT) {
    return Status::FromErrno(err, "cannot reserve " + std::to_string(bytes) + " bytes for " +
                                      file.path +
                                      ": the disk is full; free space or pick a "
                                      "path with more room")
        .WithPath(file.path);
  }
  return Status::FromErrno(err, "fallocate " + std::to_string(bytes) + " bytes for " + file.path)
      .WithPath(file.path);
}

Status SyncFile(const FileEntry& file) {
  int rc;
  do {
    rc = ::fdatasync(file.fd);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::OK();
  int err = errno;
  return Status::FromErrno(err, "fdatasync " + file.path).WithPath(file.path);
}

Status ValidateRequest(const IoRequest& r, const FileEntry* file) {
  if (file == nullptr || file->fd < 0) {
    return Status::InvalidArgument("I/O request names file handle " + std::to_string(r.file) +
                                   ", which is not open on this backend");
  }
  if (r.op != IoOp::kRead && r.op != IoOp::kWrite) {
    return Status::InvalidArgument("I/O request has an unknown operation");
  }
  if (r.length > 0 && r.buffer == nullptr) {
    return Status::InvalidArgument(std::string(OpName(r.op)) + " of " + std::to_string(r.length) +
                                   " bytes at offset " + std::to_string(r.offset) + " of " +
                                   file->path + " has a null buffer")
        .WithPath(file->path)
        .WithOffset(r.offset);
  }
  if (r.op == IoOp::kWrite && file->read_only) {
    return Status::InvalidArgument("write to " + file->path + " at offset " +
                                   std::to_string(r.offset) + ": the file was opened read-only")
        .WithPath(file->path)
        .WithOffset(r.offset);
  }
  if (r.offset > static_cast<uint64_t>(INT64_MAX) ||
      r.length > static_cast<uint64_t>(INT64_MAX) - r.offset) {
    return Status::InvalidArgument("I/O request on " + file->path + " at offset " +
                                   std::to_string(r.offset) + " with length " +
                                   std::to_string(r.length) + " overflows a file offset")
        .WithPath(file->path);
  }
  if (file->direct) {
    const uint64_t addr = reinterpret_cast<uintptr_t>(r.buffer);
    if (r.offset % kIoAlignment != 0 || r.length % kIoAlignment != 0 || addr % kIoAlignment != 0) {
      return Status::InvalidArgument(
                 std::string(OpName(r.op)) + " of " + std::to_string(r.length) +
                 " bytes at offset " + std::to_string(r.offset) + " of " + file->path +
                 " (buffer address " + std::to_string(addr % kIoAlignment) +
                 " bytes past a 4096 boundary) is not aligned: the file uses O_DIRECT, so "
                 "offset, length and buffer address must be multiples of 4096; align the "
                 "request or open the file with direct=false")
          .WithPath(file->path)
          .WithOffset(r.offset);
    }
  }
  return Status::OK();
}

Status TransferError(int err, IoOp op, const FileEntry& file, uint64_t offset, uint64_t length) {
  std::string what = std::string(op == IoOp::kRead ? "pread " : "pwrite ") +
                     std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                     " of " + file.path;
  if (err == ENOSPC || err == EDQUOT) what += " (disk full: free space or use a larger drive)";
  if (err == EBADF && op == IoOp::kWrite) what += " (file not open for writing)";
  return Status::FromErrno(err, what).WithPath(file.path).WithOffset(offset);
}

Status EndOfFileError(const FileEntry& file, uint64_t offset, uint64_t length, uint64_t done) {
  return Status::IOError("read of " + std::to_string(length) + " bytes at offset " +
                         std::to_string(offset) + " of " + file.path + " hit end of file after " +
                         std::to_string(done) + " bytes: the file is shorter than expected")
      .WithPath(file.path)
      .WithOffset(offset + done);
}

}  // namespace strata::io_internal
