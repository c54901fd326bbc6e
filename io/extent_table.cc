// ExtentTable implementation; see extent_table.h.
#include "io/extent_table.h"

#include "strata/bytes.h"
#include "strata/io.h"

namespace strata::swap_internal {

void ExtentTable::Reset(uint64_t capacity) {
  capacity_ = capacity;
  entries_.clear();
  ranges_.Reset(capacity);
  in_use_ = committed_bytes_ = 0;
}

Status ExtentTable::Load(const Manifest& manifest, const std::string& manifest_path) {
  for (const ManifestEntry& e : manifest.entries) {
    auto v = std::make_shared<ExtentVersion>();
    v->offset = e.offset;
    v->length = e.length;
    v->alloc = RoundUp(e.length, kIoAlignment);
    v->checksum = e.checksum;
    v->step = e.step;
    v->committed = true;
    if (v->alloc > 0) {
      // The extent must lie wholly inside free space: no two extents overlap.
      if (!ranges_.Claim(v->offset, v->alloc)) {
        return Status::Corruption("swap store manifest " + manifest_path + ": extent '" + e.key +
                                  "' overlaps another extent")
            .WithPath(manifest_path);
      }
      in_use_ += v->alloc;
      committed_bytes_ += v->alloc;
    }
    Entry& en = entries_[e.key];
    if (en.committed) {
      return Status::Corruption("swap store manifest " + manifest_path + " names '" + e.key +
                                "' twice")
          .WithPath(manifest_path);
    }
    en.committed = std::move(v);
  }
  committed_step_ = manifest.step;
  return Status::OK();
}

Result<VersionPtr> ExtentTable::NewVersion(std::string_view key, uint64_t length,
                                           uint64_t checksum) {
  auto v = std::make_shared<ExtentVersion>();
  v->length = length;
  v->alloc = RoundUp(length, kIoAlignment);
  v->checksum = checksum;
  if (v->alloc == 0) return v;
  std::optional<uint64_t> offset = ranges_.Allocate(v->alloc);
  if (!offset) {
    return Status::NoSpace("swap store is full: no room for " + FormatBytesExact(v->alloc) +
                           " of extent '" + std::string(key) + "'; capacity " +
                           FormatBytesExact(capacity_) + ", in use " + FormatBytesExact(in_use_) +
                           " (committed " + FormatBytesExact(committed_bytes_) +
                           "), largest free range " + FormatBytesExact(ranges_.LargestFree()) +
                           ". Commit to release superseded versions, or raise the capacity");
  }
  in_use_ += v->alloc;
  v->offset = *offset;
  return v;
}

void ExtentTable::WriteCompleted(const std::string& key, const VersionPtr& v, uint64_t seq) {
  Entry& e = entries_[key];
  if (seq > e.seq) {
    Drop(e.pending);
    e.pending = v;
    e.deleted = false;
    e.seq = seq;
  } else {
    Drop(v);  // a later write or delete of the key won
  }
}

Result<VersionPtr> ExtentTable::BeginRead(const std::string& key, bool committed,
                                          uint64_t capacity) {
  auto it = entries_.find(key);
  VersionPtr v = it == entries_.end() ? nullptr
                 : committed          ? it->second.committed
                                      : Visible(it->second);
  if (!v) {
    return Status::NotFound(std::string(committed ? "no committed extent '" : "no extent '") + key +
                            "' in the swap store");
  }
  if (v->length > capacity) {
    return Status::InvalidArgument("extent '" + key + "' has " + std::to_string(v->length) +
                                   " bytes but the read buffer " + std::to_string(capacity));
  }
  ++v->readers;
  return v;
}

void ExtentTable::EndRead(const VersionPtr& v) {
  if (--v->readers == 0 && v->dropped && !v->freed) {
    v->freed = true;
    FreeRange(v->offset, v->alloc);
  }
}

Status ExtentTable::Delete(std::string_view key) {
  auto it = entries_.find(key);
  if (it == entries_.end() || !Visible(it->second)) {
    return Status::NotFound("no extent '" + std::string(key) + "' in the swap store");
  }
  Entry& e = it->second;
  Drop(e.pending);
  e.pending.reset();
  e.deleted = true;
  e.seq = NextSeq();
  return Status::OK();
}

void ExtentTable::Revert(std::string_view key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  Drop(e.pending);
  e.pending.reset();
  e.deleted = false;
  e.seq = NextSeq();
}

Status ExtentTable::CheckCanPrepare(uint64_t step, bool restamp) const {
  if (prepared_step_) {
    return Status::InvalidArgument("swap store: commit of step " + std::to_string(step) +
                                   " while step " + std::to_string(*prepared_step_) +
                                   " is prepared; finish it first");
  }
  if (committed_step_ && (step < *committed_step_ || (step == *committed_step_ && !restamp))) {
    return Status::InvalidArgument("swap store: commit of step " + std::to_string(step) +
                                   " after step " + std::to_string(*committed_step_) +
                                   "; steps must increase");
  }
  return Status::OK();
}

std::vector<ManifestEntry> ExtentTable::ManifestEntries(uint64_t step) const {
  std::vector<ManifestEntry> out;
  out.reserve(entries_.size());
  for (const auto& [key, e] : entries_) {
    VersionPtr v = Visible(e);
    if (!v) continue;
    out.push_back(
        ManifestEntry{key, v->offset, v->length, v->checksum, v == e.pending ? step : v->step});
  }
  return out;
}

void ExtentTable::MarkPrepared(uint64_t step) {
  prepared_step_ = step;
  prepared_seq_ = seq_;
}

Result<uint64_t> ExtentTable::PreparedStep() const {
  if (!prepared_step_) {
    return Status::InvalidArgument("swap store: FinishCommit without PrepareCommit");
  }
  if (seq_ != prepared_seq_) {
    return Status::InvalidArgument(
        "swap store: the extents changed between PrepareCommit and FinishCommit of step " +
        std::to_string(*prepared_step_));
  }
  return *prepared_step_;
}

void ExtentTable::FinishCommit(uint64_t step) {
  prepared_step_.reset();
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    if (e.deleted) {
      Drop(e.committed);
      it = entries_.erase(it);
      continue;
    }
    if (e.pending) {
      Drop(e.committed);
      e.pending->committed = true;
      e.pending->step = step;
      committed_bytes_ += e.pending->alloc;
      e.committed = std::move(e.pending);
      e.pending.reset();
    }
    ++it;
  }
  committed_step_ = step;
}

VersionPtr ExtentTable::Lookup(std::string_view key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : Visible(it->second);
}

std::vector<std::string> ExtentTable::Keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, e] : entries_) {
    if (Visible(e)) keys.push_back(key);
  }
  return keys;
}

uint64_t ExtentTable::Extents() const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) n += Visible(e) ? 1 : 0;
  return n;
}

VersionPtr ExtentTable::Visible(const Entry& e) {
  if (e.deleted) return nullptr;
  return e.pending ? e.pending : e.committed;
}

void ExtentTable::Drop(const VersionPtr& v) {
  if (!v || v->dropped) return;
  v->dropped = true;
  if (v->committed) committed_bytes_ -= v->alloc;
  if (v->readers == 0 && !v->freed) {
    v->freed = true;
    FreeRange(v->offset, v->alloc);
  }
}

void ExtentTable::FreeRange(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  in_use_ -= bytes;
  ranges_.Free(offset, bytes);
}

}  // namespace strata::swap_internal
