// Reading a file a user named; see input_file.h.
#include "strata/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "strata/bytes.h"

namespace strata {
namespace {

// What a non-regular file is, in words.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

InputFile::InputFile(int fd, uint64_t size, std::string path, std::string what, uint64_t max_bytes)
    : fd_(fd), size_(size), path_(std::move(path)), what_(std::move(what)), max_bytes_(max_bytes) {}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      max_bytes_(other.max_bytes_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    max_bytes_ = other.max_bytes_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<InputFile> InputFile::Open(const std::string& path, std::string_view what,
                                  uint64_t max_bytes) {
  const std::string named = std::string(what) + " " + path;
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::FromErrno(errno, named + ": open").WithPath(path);
  InputFile file(fd, 0, path, std::string(what), max_bytes);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, named + ": fstat").WithPath(path);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(named + " is " + KindOf(st.st_mode) + ", not a regular file")
        .WithPath(path);
  }
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ > max_bytes) return file.TooLarge(file.size_);
  // O_NONBLOCK was for the open; reads of a regular file ignore it, but nothing relies on that.
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return file;
}

Status InputFile::TooLarge(uint64_t bytes) const {
  const std::string size =
      bytes > max_bytes_ ? "is " + FormatBytesExact(bytes) + ", over" : "holds more than";
  return Status::InvalidArgument(what_ + " " + path_ + " " + size + " the " +
                                 FormatBytesExact(max_bytes_) +
                                 " such a file may be; is it the right file?")
      .WithPath(path_);
}

Status InputFile::ReadAll(std::string* out) {
  out->clear();
  if (size_ > 0 && size_ < out->max_size()) out->reserve(static_cast<size_t>(size_));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::FromErrno(errno, what_ + " " + path_ + ": read")
          .WithPath(path_)
          .WithOffset(out->size());
    }
    if (n == 0) return Status::OK();
    if (static_cast<uint64_t>(n) > max_bytes_ - out->size()) return TooLarge(0);
    out->append(buf, static_cast<size_t>(n));
  }
}

Status InputFile::ReadAt(uint64_t offset, void* dst, size_t n) const {
  auto* p = static_cast<char*>(dst);
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return Status::FromErrno(errno, what_ + " " + path_ + ": read")
          .WithPath(path_)
          .WithOffset(offset + done);
    }
    if (r == 0) {
      return Status::Corruption(what_ + " " + path_ + " ended at byte " +
                                std::to_string(offset + done) + " of " +
                                std::to_string(offset + n) + " (it changed while being read?)")
          .WithPath(path_);
    }
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

Result<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                  uint64_t max_bytes) {
  STRATA_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(path, what, max_bytes));
  std::string bytes;
  STRATA_RETURN_IF_ERROR(file.ReadAll(&bytes));
  return bytes;
}

}  // namespace strata
