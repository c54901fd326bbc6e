// TempDir: a fresh folder for one test, removed with everything in it when destroyed.
// Under /var/tmp, which supports O_DIRECT on these machines (/tmp may be tmpfs elsewhere).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace strata::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "strata_test") {
    std::string tmpl = "/var/tmp/" + prefix + ".XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) {
      ADD_FAILURE() << "mkdtemp under /var/tmp failed: " << std::strerror(errno);
    } else {
      path_ = p;
    }
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace strata::testing
