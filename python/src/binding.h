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

void BindIo(pybind11::module_& m);      // io.cc: IoHandle, AlignedBuffer
void BindEngine(pybind11::module_& m);  // engine.cc: Engine

}  // namespace strata::python
