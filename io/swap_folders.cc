#include "io/swap_folders.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "strata/log.h"

namespace strata::swap_internal {

namespace {

constexpr const char* kManifestName = "strata.manifest";
constexpr const char* kTemporaryName = "strata.manifest.tmp";
constexpr const char* kLockName = "strata.lock";

// Reads `name` in the folder `dir_fd` (shown as `path`), refusing a link or non-regular file.
Result<std::string> ReadWholeFile(int dir_fd, const char* name, const std::string& path) {
  int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) {
      return Status::InvalidArgument("refusing " + path +
                                     ": it is a symbolic link; the store opens only its own "
                                     "regular files. Remove it")
          .WithPath(path);
    }
    return Status::FromErrno(err, "opening " + path).WithPath(path);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::InvalidArgument("refusing " + path + ": it is not a regular file; remove it")
        .WithPath(path);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return Status::FromErrno(err, "reading " + path).WithPath(path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

Result<std::unique_ptr<SwapFolders>> SwapFolders::Open(const std::vector<std::string>& paths) {
  if (paths.empty()) return Status::InvalidArgument("swap store: no swap folder given");
  std::unique_ptr<SwapFolders> f(new SwapFolders());
  STRATA_RETURN_IF_ERROR(f->CheckFolders(paths));
  for (const std::string& p : paths) STRATA_RETURN_IF_ERROR(f->OpenAndLock(p));
  f->manifest_path_ = JoinPath(paths[0], kManifestName);
  return f;
}

SwapFolders::~SwapFolders() {
  for (const Folder& f : folders_) {
    if (f.lock_fd >= 0) close(f.lock_fd);
    if (f.dir_fd >= 0) close(f.dir_fd);
  }
}

Status SwapFolders::CheckFolders(const std::vector<std::string>& paths) const {
  for (const std::string& p : paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0) {
      int err = errno;
      if (err == ENOENT) {
        return Status::NotFound("swap folder " + p + " does not exist; create it (mkdir -p " + p +
                                ") or give another swap path")
            .WithPath(p)
            .WithErrno(err);
      }
      return Status::FromErrno(err, "swap folder " + p).WithPath(p);
    }
    if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument("swap path " + p +
                                     " is not a folder; give a folder on the drive to use")
          .WithPath(p);
    }
    struct statvfs vfs {};
    bool ro = statvfs(p.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY);
    if (ro || access(p.c_str(), W_OK | X_OK) != 0) {
      int err = ro ? EROFS : errno;
      return Status::InvalidArgument("swap folder " + p + " is not writable (" +
                                     std::strerror(err) +
                                     "); give a folder on a writable drive or fix its "
                                     "permissions")
          .WithPath(p)
          .WithErrno(err);
    }
  }
  return Status::OK();
}

// Opens the folder once (every file of the store is then opened relative to it), refuses a
// folder given twice, and locks it: two stores sharing any folder would overwrite each
// other's files. The lock file holds the pid of its holder, for the message a second
// process gets.
Status SwapFolders::OpenAndLock(const std::string& path) {
  folders_.push_back(Folder{path});
  Folder& p = folders_.back();
  p.dir_fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (p.dir_fd < 0) return Status::FromErrno(errno, "opening swap folder " + path);
  struct stat st {};
  if (fstat(p.dir_fd, &st) != 0) return Status::FromErrno(errno, "swap folder " + path);
  for (size_t i = 0; i + 1 < folders_.size(); ++i) {
    struct stat other {};
    if (fstat(folders_[i].dir_fd, &other) == 0 && other.st_dev == st.st_dev &&
        other.st_ino == st.st_ino) {
      return Status::InvalidArgument("swap folders " + folders_[i].path + " and " + path +
                                     " are the same folder; give each --nvme folder once")
          .WithPath(path);
    }
  }
  const std::string lock_path = JoinPath(path, kLockName);
  p.lock_fd =
      openat(p.dir_fd, kLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (p.lock_fd < 0) {
    int err = errno;
    if (err == ELOOP) {
      return Status::InvalidArgument("refusing lock file " + lock_path +
                                     ": it is a symbolic link; remove it")
          .WithPath(lock_path);
    }
    return Status::FromErrno(err, "creating lock file " + lock_path).WithPath(lock_path);
  }
  struct stat lst {};
  if (fstat(p.lock_fd, &lst) != 0 || !S_ISREG(lst.st_mode)) {
    return Status::InvalidArgument("refusing lock file " + lock_path +
                                   ": it is not a regular file; remove it")
        .WithPath(lock_path);
  }
  if (flock(p.lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char buf[64] = {};
    const ssize_t got = pread(p.lock_fd, buf, sizeof(buf) - 1, 0);
    std::string holder = got > 0 ? std::string(buf, static_cast<size_t>(got)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Status::IOError("swap folder " + path + " is in use by another process" +
                           (holder.empty() ? "" : " (" + holder + ")") + " holding " + lock_path +
                           "; stop it or use another folder")
        .WithPath(lock_path)
        .WithErrno(err);
  }
  const std::string me = "pid " + std::to_string(getpid()) + "\n";
  if (ftruncate(p.lock_fd, 0) != 0 ||
      pwrite(p.lock_fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    LogWarning("could not record the pid in lock file " + lock_path);
  }
  return Status::OK();
}

Result<std::optional<std::string>> SwapFolders::ReadManifest() const {
  struct stat st {};
  if (fstatat(dir_fd(0), kManifestName, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return std::optional<std::string>();
  }
  STRATA_ASSIGN_OR_RETURN(std::string bytes,
                          ReadWholeFile(dir_fd(0), kManifestName, manifest_path_));
  return std::optional<std::string>(std::move(bytes));
}

std::optional<std::string> SwapFolders::ReadTemporary() const {
  struct stat st {};
  if (fstatat(dir_fd(0), kTemporaryName, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
    return std::nullopt;
  }
  auto bytes = ReadWholeFile(dir_fd(0), kTemporaryName, manifest_path_ + ".tmp");
  if (!bytes.ok()) return std::nullopt;
  return std::move(bytes).value();
}

void SwapFolders::RemoveTemporary() const { (void)unlinkat(dir_fd(0), kTemporaryName, 0); }

Status SwapFolders::WriteTemporary(const std::string& bytes, bool sync_folder) const {
  const int dir0 = dir_fd(0);
  const std::string tmp = manifest_path_ + ".tmp";
  auto fail = [&](int err, const std::string& what, const std::string& path) {
    RemoveTemporary();
    return Status::FromErrno(err, what + " " + path).WithPath(path);
  };
  RemoveTemporary();
  int fd = openat(dir0, kTemporaryName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fail(errno, "creating swap manifest", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      close(fd);
      return fail(err, "writing swap manifest", tmp);
    }
    done += static_cast<size_t>(w);
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    return fail(err, "fsync of swap manifest", tmp);
  }
  close(fd);
  if (sync_folder && fsync(dir0) != 0) return fail(errno, "fsync of swap folder", folder(0));
  return Status::OK();
}

Status SwapFolders::RenameTemporary() const {
  const int dir0 = dir_fd(0);
  if (renameat(dir0, kTemporaryName, dir0, kManifestName) != 0) {
    const int err = errno;
    RemoveTemporary();
    return Status::FromErrno(err, "renaming swap manifest over " + manifest_path_)
        .WithPath(manifest_path_);
  }
  if (fsync(dir0) != 0) {
    return Status::FromErrno(errno, "fsync of swap folder " + folder(0)).WithPath(folder(0));
  }
  return Status::OK();
}

}  // namespace strata::swap_internal
