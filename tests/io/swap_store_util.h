// Helpers shared by the SwapStore tests: store options over test folders, opening a store
// that must open, and extents written and read back as strings of a known pattern.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/fault_injection_backend.h"
#include "io/swap_store.h"
#include "tests/io/io_test_util.h"

namespace strata::swap_store_test {

using testing::AlignedBuffer;
using testing::FillPattern;

inline constexpr uint64_t kMiB = 1 << 20;
inline constexpr uint64_t kOddSizes[] = {0, 1, 15, 17, 1023, 4096, 4097, kMiB + 7};

inline SwapStoreOptions Options(const std::vector<std::string>& paths, uint64_t capacity,
                                IoBackendKind kind = IoBackendKind::kPosix, uint64_t stripe = 0) {
  SwapStoreOptions o;
  o.paths = paths;
  o.capacity_bytes = capacity;
  o.stripe_bytes = stripe;
  o.backend.kind = kind;
  o.backend.queue_depth = 16;
  return o;
}

inline std::unique_ptr<SwapStore> MustOpen(const SwapStoreOptions& o,
                                           std::unique_ptr<IoBackend> backend = nullptr) {
  auto r = SwapStore::Open(o, std::move(backend));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// The contents of one extent as the reference knows them.
inline std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  FillPattern(s.data(), n, seed);
  return s;
}

// Reads `key` into an aligned buffer and returns its bytes, or the status.
inline Result<std::string> ReadAll(SwapStore& store, const std::string& key) {
  auto info = store.Lookup(key);
  if (!info) return Status::NotFound(key);
  AlignedBuffer buf(info->length + 1);
  STRATA_ASSIGN_OR_RETURN(uint64_t n, store.Read(key, buf.data(), info->length + 1));
  return std::string(buf.data(), n);
}

inline Status WriteString(SwapStore& store, const std::string& key, const std::string& data) {
  AlignedBuffer buf(data.size());
  if (!data.empty()) std::memcpy(buf.data(), data.data(), data.size());
  return store.Write(key, buf.data(), data.size());
}

// Opens a store through a FaultInjectionBackend. Allocate may draw an injected ENOSPC at
// open; the next seed is tried then (the draws are deterministic per seed).
inline std::unique_ptr<SwapStore> OpenFaulty(const SwapStoreOptions& o, FaultInjectionOptions f,
                                             FaultInjectionBackend** fault) {
  for (int attempt = 0; attempt < 50; ++attempt, ++f.seed) {
    auto inner = CreateIoBackend(o.backend);
    EXPECT_TRUE(inner.ok()) << inner.status().ToString();
    if (!inner.ok()) return nullptr;
    auto fb = std::make_unique<FaultInjectionBackend>(std::move(inner).value(), f);
    *fault = fb.get();
    auto r = SwapStore::Open(o, std::move(fb));
    if (r.ok()) return std::move(r).value();
    EXPECT_EQ(r.status().code(), StatusCode::kNoSpace) << r.status().ToString();
  }
  ADD_FAILURE() << "no seed let the store open";
  return nullptr;
}

}  // namespace strata::swap_store_test
