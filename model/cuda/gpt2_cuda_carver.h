// Carver: consecutive 256-byte-aligned pieces of one workspace buffer, handed out in order. With
// a null base it only counts, so that the same carving code first sizes a workspace and then
// cuts it (the block's activations and scratch, attention's GEMM workspace). A value used on
// one thread; it allocates nothing.
#pragma once

#include <cstddef>

#include "strata/bytes.h"

namespace strata::model::cuda_ops {

class Carver {
 public:
  static constexpr size_t kAlign = 256;

  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  // The next `count` elements of T (nullptr when counting).
  template <typename T>
  T* Take(size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += RoundUp(count * sizeof(T), kAlign);
    return p;
  }
  // The bytes handed out so far, each piece rounded up to kAlign.
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

}  // namespace strata::model::cuda_ops
