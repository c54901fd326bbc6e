// Shared by the binding's files: the exception every failure becomes, and each part's Bind.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "strata/status.h"

namespace strata::python {

// Raised as strata.Error (a RuntimeError subclass) with the Status's text unchanged.
class StrataError : public std::runtime_error {
 public:
  explicit StrataError(const std::string& what) : std::runtime_error(what) {}
};

// Throws StrataError(status.ToString()) unless `status` is OK.
void ThrowIfError(const Status& status);

// Throws StrataError when `path` (what the caller calls `what`: "path", "nvme folder") holds a
// NUL byte: the C library would stop at it and use another file ("a\0b" names "a").
void CheckPathArgument(const std::string& path, const char* what);

void BindIo(pybind11::module_& m);      // io.cc: IoHandle, AlignedBuffer, AtomicFile
void BindEngine(pybind11::module_& m);  // engine.cc: Engine

}  // namespace strata::python
