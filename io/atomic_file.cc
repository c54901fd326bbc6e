#include "strata/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace strata {
namespace {

void SplitPath(const std::string& path, std::string* folder, std::string* base) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    folder->assign(1, '.');  // the current folder
    *base = path;
  } else {
    folder->assign(path, 0, slash == 0 ? 1 : slash);  // the root keeps its slash
    *base = path.substr(slash + 1);
  }
}

// InvalidArgument when `base` in `dir_fd` exists and is not a regular file.
Status CheckDestination(int dir_fd, const std::string& base, const std::string& path,
                        std::string_view who) {
  struct stat st {};
  if (::fstatat(dir_fd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::FromErrno(errno, std::string(who) + " " + path).WithPath(path);
  }
  const char* kind = S_ISDIR(st.st_mode)   ? "a folder"
                     : S_ISLNK(st.st_mode) ? "a symbolic link"
                     : S_ISREG(st.st_mode) ? nullptr
                                           : "not a regular file";
  if (kind == nullptr) return Status::OK();
  return Status::InvalidArgument(std::string(who) + " " + path + " is " + kind +
                                 "; give the path of a regular file to write")
      .WithPath(path);
}

int OpenFolder(const std::string& folder) {
  int fd;
  do {
    fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

Status FolderError(int err, const std::string& folder, const std::string& path,
                   std::string_view who) {
  if (err == ENOENT || err == ENOTDIR) {
    return Status::InvalidArgument(std::string(who) + " " + path + ": folder " + folder +
                                   " does not exist; create it or pick another path")
        .WithPath(path)
        .WithErrno(err);
  }
  return Status::InvalidArgument(std::string(who) + " " + path + ": cannot write in folder " +
                                 folder + " (" + std::strerror(err) + "); pick another path")
      .WithPath(path)
      .WithErrno(err);
}

}  // namespace

Result<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path, uint32_t mode) {
  if (path.empty() || path.back() == '/') {
    return Status::InvalidArgument("output path '" + path + "' does not name a file");
  }
  std::unique_ptr<AtomicFile> f(new AtomicFile());
  f->path_ = path;
  SplitPath(path, &f->folder_, &f->base_);
  f->dir_fd_ = OpenFolder(f->folder_);
  if (f->dir_fd_ < 0) return FolderError(errno, f->folder_, path, "output");
  STRATA_RETURN_IF_ERROR(CheckDestination(f->dir_fd_, f->base_, path, "output"));
  static std::atomic<uint64_t> counter{0};
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    f->tmp_name_ = "." + f->base_ + ".tmp." + std::to_string(::getpid()) + "." +
                   std::to_string(counter.fetch_add(1));
    fd = ::openat(f->dir_fd_, f->tmp_name_.c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST && errno != EINTR) break;
  }
  if (fd < 0) {
    const int err = errno;
    f->tmp_name_.clear();
    return FolderError(err, f->folder_, path, "output");
  }
  // Exactly `mode`, whatever the umask.
  if (::fchmod(fd, static_cast<mode_t>(mode)) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "chmod of the temporary file for " + path).WithPath(path);
  }
  f->file_ = ::fdopen(fd, "wb");
  if (f->file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "fdopen for " + path).WithPath(path);
  }
  return f;
}

AtomicFile::~AtomicFile() {
  Discard();
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

void AtomicFile::Discard() {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (!tmp_name_.empty()) {
    (void)::unlinkat(dir_fd_, tmp_name_.c_str(), 0);
    tmp_name_.clear();
  }
}

Status AtomicFile::Write(std::string_view bytes) {
  if (file_ == nullptr) return Status::InvalidArgument("write to " + path_ + " after Commit");
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return Status::FromErrno(errno ? errno : EIO, "writing " + path_).WithPath(path_);
  }
  return Status::OK();
}

Status AtomicFile::Commit() {
  if (file_ == nullptr) return Status::InvalidArgument("Commit of " + path_ + " twice");
  auto fail = [&](int err, const std::string& what) {
    Discard();
    return Status::FromErrno(err ? err : EIO, what + " " + path_).WithPath(path_);
  };
  if (std::fflush(file_) != 0 || std::ferror(file_)) return fail(errno, "writing");
  if (::fsync(::fileno(file_)) != 0) return fail(errno, "fsync of");
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) return fail(errno, "closing");
  // The destination may have become a folder or a link since Create.
  Status dest = CheckDestination(dir_fd_, base_, path_, "output");
  if (!dest.ok()) {
    Discard();
    return dest;
  }
  if (::renameat(dir_fd_, tmp_name_.c_str(), dir_fd_, base_.c_str()) != 0) {
    return fail(errno, "renaming the temporary file over");
  }
  tmp_name_.clear();
  if (::fsync(dir_fd_) != 0) {
    const int err = errno;
    return Status::FromErrno(err, "fsync of folder " + folder_ + " after writing " + path_)
        .WithPath(path_);
  }
  return Status::OK();
}

Status WriteFileAtomic(const std::string& path, std::string_view bytes, uint32_t mode) {
  STRATA_ASSIGN_OR_RETURN(auto f, AtomicFile::Create(path, mode));
  STRATA_RETURN_IF_ERROR(f->Write(bytes));
  return f->Commit();
}

Status CheckOutputPath(const std::string& path, std::string_view flag) {
  const std::string who(flag);
  if (path.empty() || path.back() == '/') {
    return Status::InvalidArgument(who + " '" + path + "' does not name a file");
  }
  std::string folder, base;
  SplitPath(path, &folder, &base);
  const int dir_fd = OpenFolder(folder);
  if (dir_fd < 0) return FolderError(errno, folder, path, who);
  Status s = CheckDestination(dir_fd, base, path, who);
  ::close(dir_fd);
  STRATA_RETURN_IF_ERROR(s);
  if (::access(folder.c_str(), W_OK | X_OK) != 0) return FolderError(errno, folder, path, who);
  return Status::OK();
}

}  // namespace strata
