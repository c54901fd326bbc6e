// FaultInjectionBackend: an IoBackend that wraps another and injects faults, for tests.
//
// Each request draws, from a seeded std::mt19937_64, whether it suffers one of: EIO, ENOSPC
// (writes), a short transfer, -EAGAIN, a delay, or a flipped bit in the data read or
// written. The wrapper behaves as a correct backend must in front of such a kernel:
//  - EIO / ENOSPC: the request never reaches the inner backend; its completion is an
//    IOError / NoSpace status (errno, path unknown to the wrapper, offset).
//  - short transfer: only a prefix is sent to the inner backend; when it completes the
//    wrapper sends the remainder, and reports OK only when both parts moved every byte.
//  - EAGAIN: the request is held back and resubmitted at the next Poll (a retry, not an
//    error).
//  - delay: the submitting thread sleeps delay_us before handing the request on.
//  - flipped bit on read: after the inner read succeeds one bit of the caller's buffer is
//    inverted and the completion is still OK — silent corruption, which only a checksum
//    (SwapStore's XXH3) can catch. Flipped bit on write: a copy of the data with one bit
//    inverted is written instead, so the *file* holds the corruption; the caller's buffer
//    is not touched.
// Counters say how many of each were injected, so a test can assert it saw the fault.
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

#include "strata/io.h"

namespace strata {

struct FaultInjectionOptions {
  uint64_t seed = 1;            // same seed + same calls = same faults
  double eio = 0.0;             // probability per request of an EIO completion
  double enospc = 0.0;          // per write request (and per Allocate) of ENOSPC
  double short_transfer = 0.0;  // per request of a short transfer (completed by the wrapper)
  double eagain = 0.0;          // per request of -EAGAIN (retried by the wrapper)
  double delay = 0.0;           // per request of a sleep of delay_us before submission
  uint32_t delay_us = 200;
  double flip_read = 0.0;   // per read of one flipped bit in the returned data
  double flip_write = 0.0;  // per write of one flipped bit in the data written
};

struct FaultCounters {
  uint64_t eio = 0;
  uint64_t enospc = 0;
  uint64_t short_transfers = 0;
  uint64_t eagain = 0;
  uint64_t delays = 0;
  uint64_t flipped_reads = 0;
  uint64_t flipped_writes = 0;
  uint64_t total() const {
    return eio + enospc + short_transfers + eagain + delays + flipped_reads + flipped_writes;
  }
};

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
  Status Sync(int file) override { return inner_->Sync(file); }
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

  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Pending> pending_;  // by inner user_data
  std::deque<uint64_t> retry_;                     // ids held back by an injected EAGAIN
  std::deque<IoCompletion> ready_;
  size_t in_flight_ = 0;
};

}  // namespace strata
