// The parsers under fuzzing read files by path (as the CLI gives them), so each fuzz target
// writes its input to a file first: FuzzInputPath writes `data` as `name` inside one
// temporary folder per process (made on first use, removed at exit) and returns the path.
// Not thread-safe: a fuzz process runs one input at a time.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::fuzz {

inline const std::string& FuzzFolder() {
  // Never destroyed: the atexit handler that removes the folder runs after the destructors of
  // statics made before it was registered.
  static const std::string* const folder = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* templ = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                                  "/strata_fuzz_XXXXXX");
    if (::mkdtemp(templ->data()) == nullptr) {
      std::perror("strata fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(FuzzFolder(), ec);
    });
    return templ;
  }();
  return *folder;
}

inline std::string FuzzInputPath(const uint8_t* data, size_t size, const char* name) {
  const std::string path = FuzzFolder() + "/" + name;
  // A new file each time: truncating one that holds data makes ext4 flush it (auto_da_alloc),
  // a hundred times slower.
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(("strata fuzz: open " + path).c_str());
    std::abort();
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) {
      std::perror(("strata fuzz: write " + path).c_str());
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

}  // namespace strata::fuzz
