#include "io/fault_injection_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace strata {

FaultInjectionBackend::FaultInjectionBackend(std::unique_ptr<IoBackend> inner,
                                             const FaultInjectionOptions& options)
    : inner_(std::move(inner)),
      options_(options),
      name_("fault(" + std::string(inner_->Name()) + ")"),
      rng_(options.seed) {}

FaultInjectionBackend::~FaultInjectionBackend() {
  // The inner backend's destructor waits for the requests it holds, which may still read
  // the flipped-write copies owned by pending_: destroy it first.
  inner_.reset();
}

bool FaultInjectionBackend::Draw(double p) {
  if (p <= 0.0) return false;
  if (p >= 1.0) return true;
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p;
}

void FaultInjectionBackend::FlipOneBit(void* data, uint64_t length) {
  if (length == 0) return;
  const uint64_t bit = std::uniform_int_distribution<uint64_t>(0, length * 8 - 1)(rng_);
  static_cast<unsigned char*>(data)[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
}

IoRequest FaultInjectionBackend::InnerRequest(uint64_t id, const Pending& p) const {
  IoRequest r = p.outer;
  r.user_data = id;
  if (p.copy != nullptr) r.buffer = p.copy;
  if (p.split > 0) {
    if (p.second_part) {
      r.offset += p.split;
      r.length -= p.split;
      r.buffer = static_cast<char*>(r.buffer) + p.split;
    } else {
      r.length = p.split;
    }
  }
  return r;
}

Status FaultInjectionBackend::Allocate(int file, uint64_t bytes) {
  if (Draw(options_.enospc)) {
    ++counters_.enospc;
    return Status::FromErrno(ENOSPC,
                             "injected fault: fallocate " + std::to_string(bytes) + " bytes");
  }
  return inner_->Allocate(file, bytes);
}

Status FaultInjectionBackend::Sync(int file) {
  ++syncs_seen_;
  if (syncs_seen_ == options_.sync_eio_at || Draw(options_.sync_eio)) {
    ++counters_.sync_failures;
    return Status::FromErrno(EIO, "injected fault: fdatasync");
  }
  return inner_->Sync(file);
}

Status FaultInjectionBackend::Submit(std::span<const IoRequest> requests) {
  // Refuse a bad batch before drawing any fault, as every backend refuses it whole.
  for (const IoRequest& r : requests) STRATA_RETURN_IF_ERROR(inner_->CheckRequest(r));
  const FaultCounters saved_counters = counters_;
  const size_t saved_ready = ready_.size();
  const size_t saved_retry = retry_.size();
  std::vector<uint64_t> added;
  std::vector<IoRequest> forward;
  size_t accepted = 0;
  const uint64_t saved_reads = reads_seen_, saved_writes = writes_seen_;
  for (const IoRequest& r : requests) {
    ++accepted;
    const bool read = r.op == IoOp::kRead;
    const uint64_t nth = read ? ++reads_seen_ : ++writes_seen_;
    const bool eio_at = nth == (read ? options_.eio_read_at : options_.eio_write_at);
    if (eio_at || Draw(options_.eio)) {
      ++counters_.eio;
      ready_.push_back(IoCompletion{
          r.user_data, Status::FromErrno(EIO, std::string("injected fault: ") +
                                                  (r.op == IoOp::kRead ? "read" : "write") +
                                                  " at offset " + std::to_string(r.offset))
                           .WithOffset(r.offset)});
      continue;
    }
    if (r.op == IoOp::kWrite && (nth == options_.enospc_write_at || Draw(options_.enospc))) {
      ++counters_.enospc;
      ready_.push_back(IoCompletion{
          r.user_data,
          Status::FromErrno(ENOSPC, "injected fault: write at offset " + std::to_string(r.offset))
              .WithOffset(r.offset)});
      continue;
    }
    Pending p;
    p.outer = r;
    if (r.length > 0) {
      const uint64_t gran = inner_->IsDirect(r.file) ? kIoAlignment : 1;
      const bool short_at = !read && nth == options_.short_write_at;
      if (r.length >= 2 * gran && (short_at || Draw(options_.short_transfer))) {
        const uint64_t units = r.length / gran;
        p.split = gran * std::uniform_int_distribution<uint64_t>(1, units - 1)(rng_);
        ++counters_.short_transfers;
      }
      if (read && (nth == options_.flip_read_at || Draw(options_.flip_read))) p.flip_read = true;
      if (!read && r.buffer != nullptr &&
          (nth == options_.flip_write_at || Draw(options_.flip_write))) {
        p.storage.resize(r.length + kIoAlignment);
        const auto base = reinterpret_cast<uintptr_t>(p.storage.data());
        p.copy = p.storage.data() + ((kIoAlignment - base % kIoAlignment) % kIoAlignment);
        std::memcpy(p.copy, r.buffer, r.length);
        FlipOneBit(p.copy, r.length);
        ++counters_.flipped_writes;
      }
    }
    if (Draw(options_.delay)) {
      ++counters_.delays;
      std::this_thread::sleep_for(std::chrono::microseconds(options_.delay_us));
    }
    const uint64_t id = next_id_++;
    const bool hold = Draw(options_.eagain);
    auto [it, inserted] = pending_.emplace(id, std::move(p));
    (void)inserted;
    added.push_back(id);
    if (hold) {
      ++counters_.eagain;
      retry_.push_back(id);
    } else {
      forward.push_back(InnerRequest(id, it->second));
    }
  }
  Status s = inner_->Submit(forward);
  if (!s.ok()) {
    // The inner backend refused the batch (a bad request): undo everything so the caller
    // sees the same all-or-nothing Submit as from any backend.
    for (uint64_t id : added) pending_.erase(id);
    ready_.resize(saved_ready);
    retry_.resize(saved_retry);
    counters_ = saved_counters;
    reads_seen_ = saved_reads;
    writes_seen_ = saved_writes;
    return s;
  }
  in_flight_ += accepted;
  return Status::OK();
}

Result<size_t> FaultInjectionBackend::Poll(std::span<IoCompletion> out, size_t min_complete) {
  const size_t want = std::min({min_complete, in_flight_, out.size()});
  std::vector<IoCompletion> got(std::max<size_t>(inner_->QueueDepth(), 16));
  do {
    if (!retry_.empty()) {
      std::vector<IoRequest> again;
      for (uint64_t id : retry_) again.push_back(InnerRequest(id, pending_.at(id)));
      retry_.clear();
      // These passed the inner backend's checks once; a failure now is reported per request.
      Status s = inner_->Submit(again);
      if (!s.ok()) {
        for (const IoRequest& r : again) {
          ready_.push_back(IoCompletion{pending_.at(r.user_data).outer.user_data, s});
          pending_.erase(r.user_data);
        }
      }
    }
    const size_t need = ready_.size() < want ? 1 : 0;
    if (need > 0 && inner_->InFlight() == 0) {
      return Status::IOError("fault injection backend lost track of requests (internal error)");
    }
    STRATA_ASSIGN_OR_RETURN(size_t n, inner_->Poll(std::span<IoCompletion>(got), need));
    for (size_t i = 0; i < n; ++i) {
      IoCompletion& c = got[i];
      auto it = pending_.find(c.user_data);
      if (it == pending_.end()) continue;
      Pending& p = it->second;
      if (!c.status.ok()) {
        ready_.push_back(IoCompletion{p.outer.user_data, std::move(c.status)});
        pending_.erase(it);
        continue;
      }
      if (p.split > 0 && !p.second_part) {
        // The short part arrived: complete the rest ourselves, as a backend must.
        p.second_part = true;
        IoRequest rest = InnerRequest(it->first, p);
        Status s = inner_->Submit(std::span<const IoRequest>(&rest, 1));
        if (!s.ok()) {
          ready_.push_back(IoCompletion{p.outer.user_data, s});
          pending_.erase(it);
        }
        continue;
      }
      if (p.flip_read) {
        FlipOneBit(p.outer.buffer, p.outer.length);
        ++counters_.flipped_reads;
      }
      ready_.push_back(IoCompletion{p.outer.user_data, Status::OK()});
      pending_.erase(it);
    }
  } while (ready_.size() < want);

  const size_t n = std::min(out.size(), ready_.size());
  for (size_t i = 0; i < n; ++i) {
    out[i] = std::move(ready_.front());
    ready_.pop_front();
  }
  in_flight_ -= n;
  return n;
}

std::unique_ptr<IoBackend> CreateFaultInjectionBackend(std::unique_ptr<IoBackend> inner,
                                                       const FaultInjectionOptions& options) {
  return std::make_unique<FaultInjectionBackend>(std::move(inner), options);
}

const FaultCounters* InjectedFaults(const IoBackend& backend) {
  const auto* f = dynamic_cast<const FaultInjectionBackend*>(&backend);
  return f ? &f->counters() : nullptr;
}

IoBackendFactory FaultInjectionFactory(const FaultInjectionOptions& faults) {
  return [faults](const IoBackendOptions& options) -> Result<std::unique_ptr<IoBackend>> {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> inner, CreateIoBackend(options));
    return CreateFaultInjectionBackend(std::move(inner), faults);
  };
}

}  // namespace strata
