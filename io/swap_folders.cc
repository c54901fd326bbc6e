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

#include "strata/bytes.h"
#include "strata/log.h"

namespace strata::swap_internal {

namespace {

constexpr const char* kManifestName = "strata.manifest";
constexpr const char* kTemporaryName = "strata.manifest.tmp";
constexpr const char* kLockName = "strata.lock";

std::string DataFileName(size_t index, size_t folders) {
  return "strata.swap." + std::to_string(index) + "-of-" + std::to_string(folders);
}

}  // namespace

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

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

Result<std::unique_ptr<SwapFolders>> SwapFolders::Open(const std::vector<std::string>& paths) {
  if (paths.empty()) return Status::InvalidArgument("swap store: no swap folder given");
  std::unique_ptr<SwapFolders> f(new SwapFolders());
  STRATA_RETURN_IF_ERROR(f->CheckFolders(paths));
  for (const std::string& p : paths) STRATA_RETURN_IF_ERROR(f->OpenAndLock(p));
  for (size_t i = 0; i < paths.size(); ++i) {
    Folder& folder = f->folders_[i];
    folder.data_file_name = DataFileName(i, paths.size());
    folder.data_file = JoinPath(folder.path, folder.data_file_name);
  }
  f->manifest_path_ = JoinPath(paths[0], kManifestName);
  return f;
}

std::vector<std::string> SwapFolders::StateFileNames(size_t index, size_t folders) {
  std::vector<std::string> names;
  if (index == 0) names.push_back(kManifestName);
  names.push_back(DataFileName(index, folders));
  return names;
}

bool SwapFolders::HasManifest(const std::string& folder) {
  struct stat st {};
  return lstat(JoinPath(folder, kManifestName).c_str(), &st) == 0;
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
  folders_.emplace_back();
  Folder& p = folders_.back();
  p.path = path;
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
    // The holder's pid is in the file; an engine of this very process is told apart, since
    // "stop it" would then be the wrong advice.
    if (holder == "pid " + std::to_string(getpid())) {
      return Status::IOError("swap folder " + path +
                             " is in use by another engine in this "
                             "process (" +
                             holder + ") holding " + lock_path +
                             "; close that engine first or use another folder")
          .WithPath(lock_path)
          .WithErrno(err);
    }
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

Status SwapFolders::CheckDataFiles(const std::vector<uint64_t>& needed_end, bool has_extents,
                                   uint64_t file_bytes, uint64_t capacity) const {
  // Free space: sum what each file system must still provide.
  struct FsNeed {
    std::vector<std::string> folders;
    uint64_t need = 0;
    uint64_t free = 0;
  };
  std::map<dev_t, FsNeed> by_fs;
  for (size_t i = 0; i < folders_.size(); ++i) {
    const Folder& f = folders_[i];
    struct stat fst {};
    uint64_t have = 0;
    if (fstatat(f.dir_fd, f.data_file_name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!S_ISREG(fst.st_mode)) {
        return Status::InvalidArgument(
                   "refusing swap file " + f.data_file + ": it is " +
                   (S_ISLNK(fst.st_mode) ? "a symbolic link" : "not a regular file") +
                   "; the store writes only its own regular files. Remove it or use another "
                   "folder")
            .WithPath(f.data_file);
      }
      have = static_cast<uint64_t>(fst.st_blocks) * 512;
      if (static_cast<uint64_t>(fst.st_size) < needed_end[i]) {
        return Status::Corruption(
                   "swap file " + f.data_file + " came back short: " + std::to_string(fst.st_size) +
                   " bytes, but the committed extents need " + std::to_string(needed_end[i]) +
                   "; it was truncated or replaced. Restore it from a "
                   "checkpoint")
            .WithPath(f.data_file);
      }
    } else if (has_extents && needed_end[i] > 0) {
      return Status::Corruption("swap file " + f.data_file +
                                " named by the manifest is missing; restore it from a "
                                "checkpoint or give the folders in their original order")
          .WithPath(f.data_file);
    }
    struct stat dst {};
    struct statvfs vfs {};
    if (fstat(f.dir_fd, &dst) != 0 || fstatvfs(f.dir_fd, &vfs) != 0) {
      int err = errno;
      return Status::FromErrno(err, "statvfs " + f.path).WithPath(f.path);
    }
    FsNeed& fs = by_fs[dst.st_dev];
    fs.folders.push_back(f.path);
    fs.need += file_bytes > have ? file_bytes - have : 0;
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
                           FormatBytesExact(capacity) + " over " + std::to_string(folders_.size()) +
                           " folder(s)); free space there, lower the swap capacity, or add "
                           "swap folders on other drives")
        .WithPath(fs.folders[0]);
  }

  return Status::OK();
}

Result<int> SwapFolders::OpenDataFile(IoBackend& backend, size_t i, bool direct) const {
  const Folder& f = folders_[i];
  OpenOptions oo;
  oo.create = true;
  oo.direct = direct;
  oo.dir_fd = f.dir_fd;
  oo.no_follow = true;
  oo.mode = 0600;
  // A new file is created, never taken over; an existing one must be a plain file.
  struct stat fst {};
  oo.exclusive = fstatat(f.dir_fd, f.data_file_name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) != 0;
  return backend.OpenFile(f.data_file_name, oo);
}

Result<Manifest> SwapFolders::PeekManifest(const std::string& folder) {
  const std::string path = JoinPath(folder, kManifestName);
  int dir = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return Status::FromErrno(errno, "opening folder " + folder).WithPath(folder);
  Result<std::string> bytes = ReadWholeFile(dir, kManifestName, path);
  close(dir);
  if (!bytes.ok()) return bytes.status();
  return DecodeManifest(*bytes, path);
}

Result<std::optional<uint64_t>> SwapFolders::PeekCommittedStep(const std::string& folder) {
  STRATA_ASSIGN_OR_RETURN(const Manifest m, PeekManifest(folder));
  return m.step;
}

Result<std::optional<Manifest>> SwapFolders::ReadManifest() const {
  struct stat st {};
  if (fstatat(dir_fd(0), kManifestName, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return std::optional<Manifest>();
  }
  STRATA_ASSIGN_OR_RETURN(std::string bytes,
                          ReadWholeFile(dir_fd(0), kManifestName, manifest_path_));
  STRATA_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(bytes, manifest_path_));
  return std::optional<Manifest>(std::move(m));
}

Result<Manifest> SwapFolders::ResolvePrepared(Manifest committed, const Decider& decide,
                                              const std::string& next_run_id) const {
  std::optional<Manifest> prepared;
  // Anything short of a complete manifest of a later step with the same run and geometry is a
  // commit cut short before its manifest was durable: not a prepared one.
  if (std::optional<std::string> bytes = ReadTemporary()) {
    auto m = DecodeManifest(*bytes, manifest_path_ + ".tmp");
    // A commit under a new identity (next_run_id) may record the committed step again.
    const bool restamp = !next_run_id.empty() && m.ok() && m->run_id == next_run_id &&
                         m->run_id != committed.run_id && committed.step && m->step &&
                         *m->step == *committed.step;
    if (m.ok() && m->step && (!committed.step || *m->step > *committed.step || restamp) &&
        (m->run_id == committed.run_id || (!next_run_id.empty() && m->run_id == next_run_id)) &&
        m->num_paths == committed.num_paths && m->stripe_bytes == committed.stripe_bytes &&
        (m->capacity_bytes == committed.capacity_bytes || m->run_id != committed.run_id)) {
      prepared = std::move(*m);
    }
  }
  STRATA_ASSIGN_OR_RETURN(
      const bool roll_forward,
      decide(committed.step, prepared ? prepared->step : std::optional<uint64_t>()));
  if (!roll_forward) return committed;
  if (!prepared) {
    return Status::InvalidArgument("swap store in " + folder(0) +
                                   ": asked to roll forward a prepared commit, but there is none");
  }
  STRATA_RETURN_IF_ERROR(RenameTemporary().Annotate("rolling the prepared commit of step " +
                                                    std::to_string(*prepared->step) + " forward"));
  return std::move(*prepared);
}

std::optional<std::string> SwapFolders::PeekTemporary(const std::string& folder) {
  const int dir = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return std::nullopt;
  struct stat st {};
  std::optional<std::string> out;
  if (fstatat(dir, kTemporaryName, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
    auto bytes = ReadWholeFile(dir, kTemporaryName, JoinPath(folder, kTemporaryName));
    if (bytes.ok()) out = std::move(bytes).value();
  }
  close(dir);
  return out;
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
