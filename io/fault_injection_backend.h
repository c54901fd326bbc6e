// FaultInjectionBackend: the fault-injecting IoBackend of strata/fault_injection.h (what it
// injects and how it behaves is documented there). The class is the io module's own; code
// outside io/ makes one with CreateFaultInjectionBackend or FaultInjectionFactory.
//
// Ownership: owns the inner backend. Thread safety: as the inner backend (one submitting
// thread); counters() may be read by that thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/fault_injection.h"
#include "strata/io.h"

namespace strata {

class FaultInjectionBackend final : public IoBackend {
 public:
  FaultInjectionBackend(std::unique_ptr<IoBackend> inner, const FaultInjectionOptions& options);
  ~FaultInjectionBackend() override;

  std::string_view Name() const override { return name_; }
  uint32_t Capabilities() const override { return inner_->Capabilities(); }
  uint32_t QueueDepth() const override { return inner_->QueueDepth(); }

  Result<int> OpenFile(const std::string& path, const OpenOptions& options) override {
    return inner_->OpenFile(path, options);
  }
  Status CloseFile(int file) override { return inner_->CloseFile(file); }
  bool IsDirect(int file) const override { return inner_->IsDirect(file); }
  // Injects ENOSPC with probability `enospc`, else forwards.
  Status Allocate(int file, uint64_t bytes) override;
  // Injects EIO with probability `sync_eio` (and at the sync_eio_at-th call), else forwards.
  Status Sync(int file) override;
  Status RegisterBuffers(std::span<const BufferRegion> regions) override {
    return inner_->RegisterBuffers(regions);
  }

  Status CheckRequest(const IoRequest& request) const override {
    return inner_->CheckRequest(request);
  }
  Status Submit(std::span<const IoRequest> requests) override;
  Result<size_t> Poll(std::span<IoCompletion> out, size_t min_complete) override;
  size_t InFlight() const override { return in_flight_; }

  const FaultCounters& counters() const { return counters_; }
  IoBackend& inner() { return *inner_; }

 private:
  struct Pending {
    IoRequest outer;           // the caller's request
    uint64_t split = 0;        // short transfer: bytes sent in the first part (0 = none)
    bool second_part = false;  // the remainder is in flight
    bool flip_read = false;
    std::vector<char> storage;  // flip_write: aligned copy of the data (over-allocated)
    char* copy = nullptr;       // 4096-aligned pointer into storage
  };

  bool Draw(double p);
  IoRequest InnerRequest(uint64_t id, const Pending& p) const;
  void FlipOneBit(void* data, uint64_t length);

  std::unique_ptr<IoBackend> inner_;
  FaultInjectionOptions options_;
  std::string name_;
  std::mt19937_64 rng_;
  FaultCounters counters_;
  uint64_t reads_seen_ = 0, writes_seen_ = 0, syncs_seen_ = 0;  // for the *_at faults

  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Pending> pending_;  // by inner user_data
  std::deque<uint64_t> retry_;                     // ids held back by an injected EAGAIN
  std::deque<IoCompletion> ready_;
  size_t in_flight_ = 0;
};

}  // namespace strata
