// Fault injection for the NVMe tier: an IoBackend that wraps another and injects the faults
// a real kernel and drive can produce, so a program built on an IoBackend (a SwapStore, an
// Engine through EngineOptions::io_backend_factory) can be tested against them.
//
// Each request draws, from a seeded std::mt19937_64, whether it suffers one of: EIO, ENOSPC
// (writes), a short transfer, -EAGAIN, a delay, or a flipped bit in the data read or
// written; each Sync whether it fails with EIO. The `*_at` options put one fault on the
// N-th request of a kind instead. The wrapper behaves as a correct backend must in front of such a
// kernel:
//  - EIO / ENOSPC: the request never reaches the inner backend; its completion is an
//    IOError / NoSpace status (errno, path unknown to the wrapper, offset).
//  - short transfer: only a prefix is sent to the inner backend; when it completes the
//    wrapper sends the remainder, and reports OK only when both parts moved every byte.
//  - EAGAIN: the request is held back and resubmitted at the next Poll (a retry, not an
//    error).
//  - delay: the submitting thread sleeps delay_us before handing the request on.
//  - flipped bit on read: after the inner read succeeds one bit of the caller's buffer is
//    inverted and the completion is still OK: silent corruption, which only a checksum
//    (the SwapStore's XXH3) can catch. Flipped bit on write: a copy of the data with one bit
//    inverted is written instead, so the *file* holds the corruption; the caller's buffer
//    is not touched.
// So short transfers, EAGAIN and delays must be invisible to a correct user; EIO, ENOSPC
// and flipped bits must surface as errors (Corruption for a flipped bit under a checksum).
//
// Example (an engine whose NVMe reads and writes are split and retried):
//   FaultInjectionOptions faults;
//   faults.short_transfer = 0.3;
//   faults.eagain = 0.3;
//   options.io_backend_factory = FaultInjectionFactory(faults);
//
// Ownership: a fault-injecting backend owns its inner backend. Thread safety: as the inner
// backend (one submitting thread).
#pragma once

#include <cstdint>
#include <memory>

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
  double sync_eio = 0.0;    // per Sync (fdatasync) of an EIO failure (the data not synced)
  // Deterministic faults, for tests that put one fault at one point of a run: the N-th
  // request of its kind (counted from 1 over the backend's life) suffers it; 0 = off.
  uint64_t eio_read_at = 0;      // the N-th read completes with EIO
  uint64_t eio_write_at = 0;     // the N-th write completes with EIO
  uint64_t enospc_write_at = 0;  // the N-th write completes with ENOSPC
  uint64_t short_write_at = 0;   // the N-th write is split in two (invisible to a correct user)
  uint64_t flip_read_at = 0;     // the N-th read returns one flipped bit
  uint64_t flip_write_at = 0;    // the N-th write puts one flipped bit on the disk
  uint64_t sync_eio_at = 0;      // the N-th Sync fails with EIO
};

// How many faults of each kind a fault-injecting backend has injected.
struct FaultCounters {
  uint64_t eio = 0;
  uint64_t enospc = 0;
  uint64_t short_transfers = 0;
  uint64_t eagain = 0;
  uint64_t delays = 0;
  uint64_t flipped_reads = 0;
  uint64_t flipped_writes = 0;
  uint64_t sync_failures = 0;
  uint64_t total() const {
    return eio + enospc + short_transfers + eagain + delays + flipped_reads + flipped_writes +
           sync_failures;
  }
};

// Wraps `inner` (required) in a backend that injects faults as `options` say. Its Name() is
// "fault(<inner's name>)".
std::unique_ptr<IoBackend> CreateFaultInjectionBackend(std::unique_ptr<IoBackend> inner,
                                                       const FaultInjectionOptions& options);

// The counters of a backend made by CreateFaultInjectionBackend (or FaultInjectionFactory);
// nullptr for any other backend. Read them on the submitting thread, or while it is idle
// (an engine between steps).
const FaultCounters* InjectedFaults(const IoBackend& backend);

// An IoBackendFactory that makes the default backend for the options it is given
// (CreateIoBackend) and wraps it with CreateFaultInjectionBackend(·, faults).
IoBackendFactory FaultInjectionFactory(const FaultInjectionOptions& faults);

}  // namespace strata
