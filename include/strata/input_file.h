// InputFile: reads a file a user named (a flag's value: --config, --io-config, --init,
// --tokenizer, --data), refusing what is not one. The file must be a regular file (symbolic
// links are followed: the user named it) of at most a given size. A folder, a FIFO, a device
// or a socket is refused by name, and opening never waits: the open is O_NONBLOCK, so a FIFO
// with no writer does not block it, and the type is checked (fstat) before the first read.
// The size bound holds for what is read, not only for what fstat says: a /proc file (size 0)
// or a file that grows while it is read is refused once it passes the bound.
//
// The counterpart of CheckOutputPath (strata/atomic_file.h) for inputs. An InputFile owns its
// descriptor (closed on destruction); it is not safe for concurrent use, the functions
// below are (no shared state).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

inline constexpr uint64_t kNoSizeLimit = std::numeric_limits<uint64_t>::max();

class InputFile {
 public:
  // Opens `path` for reading. `what` names the file in messages, before its path: "--config"
  // gives "--config /x is a folder, not a regular file". Errors: the open's errno (NotFound
  // for a missing file, IOError for EACCES...), "<what> <path>: open: <strerror>";
  // InvalidArgument when it is not a regular file or its size is over `max_bytes`.
  static Result<InputFile> Open(const std::string& path, std::string_view what,
                                uint64_t max_bytes = kNoSizeLimit);
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  ~InputFile();

  int fd() const { return fd_; }
  // The size fstat gave at Open (0 for most /proc files, which have content all the same).
  uint64_t size() const { return size_; }

  // The rest of the file, to its end, in `*out` (replaced). InvalidArgument as Open's when
  // it passes `max_bytes`; IOError naming the path and offset when a read fails.
  Status ReadAll(std::string* out);
  // Exactly `n` bytes from offset `offset` into `dst` (pread; the position is unchanged).
  // Corruption when the file ends first (it shrank since Open), IOError when a read fails.
  Status ReadAt(uint64_t offset, void* dst, size_t n) const;

 private:
  InputFile(int fd, uint64_t size, std::string path, std::string what, uint64_t max_bytes);
  // `bytes`: the size fstat gave, or 0 when reading passed the bound.
  Status TooLarge(uint64_t bytes) const;

  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
  std::string what_;
  uint64_t max_bytes_ = kNoSizeLimit;
};

// The whole of `path`: InputFile::Open, then ReadAll. Errors: theirs.
Result<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                  uint64_t max_bytes = kNoSizeLimit);

}  // namespace strata
